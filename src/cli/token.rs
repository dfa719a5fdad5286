//! `tumbler token`: make a bearer token and its tokens-file entry.

use clap::Args;

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

/// Prints the token and its TOML entry (TOML whatever `-o` says: it goes
/// into the tokens file). The namespaces are the `--namespace` flags, each
/// a name, a `prefix*` or `*`.
pub fn run(args: TokenArgs, globals: &Globals) -> Result<u8, Failure> {
    if globals.namespace.is_empty() {
        return Err(Failure::usage(
            "token: name at least one --namespace the token may act in (`prefix*` and `*` work)",
        ));
    }
    let token = match args.existing {
        Some(token) => token,
        None => crate::auth::new_token()
            .map_err(|e| Failure::Status(tonic::Status::internal(e.to_string())))?,
    };
    let namespaces = globals
        .namespace
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "# token (give this to the client; it is not stored anywhere):\n\
         #   {token}\n\
         [[token]]\n\
         name = {:?}\n\
         sha256 = \"{}\"\n\
         role = \"{}\"\n\
         namespaces = [{namespaces}]\n",
        args.name,
        crate::auth::token_digest(&token),
        args.role
    );
    write_stdout(&text)?;
    Ok(exit::SUCCESS)
}
