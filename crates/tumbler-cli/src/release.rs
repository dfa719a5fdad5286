//! `tumbler release`: give a grant back.

use clap::Args;

use super::connect::{Conn, Target};
use super::output::enum_name;
use super::{Failure, Globals, GrantRef, LockNames, exit};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub lock: LockNames,
    #[command(flatten)]
    pub grant: GrantRef,
    #[command(flatten)]
    pub tokens: SetTokens,
}

/// A set's fencing tokens (`release`, `extend` of several names; decision
/// 0079).
#[derive(Args, Debug)]
pub struct SetTokens {
    /// With several names: each lock's fencing token, in the order of the
    /// names (e.g. `--tokens 12,13`); a lock whose grant carries another
    /// token is left alone and the answer is NOT_HELD.
    #[arg(long, value_delimiter = ',', value_name = "TOKEN,...")]
    pub tokens: Vec<u64>,
}

impl SetTokens {
    /// The request's `fencing_tokens` for a set of `names` (none for a
    /// single lock): one per name, none of them 0, checked before sending.
    pub fn for_names(self, names: &[String]) -> Result<Vec<u64>, Failure> {
        let tokens = self.tokens;
        if tokens.is_empty() {
            return Ok(tokens);
        }
        if names.is_empty() {
            return Err(Failure::usage(
                "--tokens pins the locks of a set (several names); one lock's token is --token",
            ));
        }
        if tokens.len() != names.len() {
            return Err(Failure::usage(format!(
                "--tokens needs one token per name, in their order ({} names, {} tokens)",
                names.len(),
                tokens.len()
            )));
        }
        if tokens.contains(&0) {
            return Err(Failure::usage(
                "--tokens: a fencing token is never 0 (use the tokens the set was granted)",
            ));
        }
        Ok(tokens)
    }
}

pub async fn run(args: ReleaseArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let namespace = globals.namespace()?;
    let lock = args.lock.display(&namespace);
    let (name, names) = args.lock.split();
    let fencing_tokens = args.tokens.for_names(&names)?;
    let request = proto::ReleaseRequest {
        namespace,
        name,
        holder: args.grant.holder,
        fencing_token: args.grant.token,
        names,
        fencing_tokens,
    };
    let reply = call!(conn, release, request).await?;
    let status = enum_name(reply.status().as_str_name(), "RELEASE_STATUS_");
    globals.output().reply(&reply, || {
        format!("{status} {lock} (holder {})\n", request.holder)
    })?;
    Ok(match reply.status() {
        proto::ReleaseStatus::Released => exit::SUCCESS,
        _ => exit::NOT_HELD,
    })
}
