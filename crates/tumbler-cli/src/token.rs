//! `tumbler token`: make a bearer token and its tokens-file entry. The
//! entry is a [`TokensFile`] serialized with `toml`, in the shape the
//! server's tokens file (`auth.rs`) reads: one `[[token]]` table.

use clap::Args;
use serde::Serialize;

use super::output::write_stdout;
use super::{Failure, Globals, exit};

#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The token's name in logs.
    #[arg(long)]
    pub name: String,
    /// `client` (locks in its namespaces) or `admin` (also clear, reap
    /// with a cutoff).
    #[arg(long, default_value = "client", value_parser = ["client", "admin"])]
    pub role: String,
    /// Hash this token instead of making a new one.
    #[arg(long)]
    pub existing: Option<String>,
}

/// A tokens file holding one entry: `[[token]]`.
#[derive(Serialize)]
struct TokensFile<'a> {
    token: [Entry<'a>; 1],
}

/// One `[[token]]` table: the token's digest, never the token.
#[derive(Serialize)]
struct Entry<'a> {
    name: &'a str,
    sha256: String,
    role: &'a str,
    namespaces: &'a [String],
}

/// Prints the token and its TOML entry (TOML whatever `-o` says: it goes
/// into the tokens file). The namespaces are the `--namespace` flags, each
/// a name, a `prefix*` or `*`.
pub fn run(args: TokenArgs, globals: &Globals) -> Result<u8, Failure> {
    if globals.namespace.is_empty() {
        return Err(Failure::usage(
            "token: name at least one --namespace the token may act in (`prefix*` and `*` work)",
        ));
    }
    let internal = |e: String| Failure::Status(tonic::Status::internal(e));
    let token = match args.existing {
        Some(token) => token,
        None => new_token().map_err(|e| internal(format!("no randomness: {e}")))?,
    };
    let entry = toml::to_string(&TokensFile {
        token: [Entry {
            name: &args.name,
            sha256: tumbler_proto::tokens::digest(&token),
            role: &args.role,
            namespaces: &globals.namespace,
        }],
    })
    .map_err(|e| internal(format!("cannot write the tokens-file entry: {e}")))?;
    write_stdout(&format!(
        "# token (give this to the client; it is not stored anywhere):\n#   {token}\n{entry}"
    ))?;
    Ok(exit::SUCCESS)
}

/// A new random bearer token: `tmb_` and 32 bytes from the OS, in hex.
fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("tmb_{}", hex::encode(bytes)))
}
