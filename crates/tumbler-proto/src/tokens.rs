//! Bearer tokens as the server's tokens file (`--auth-tokens-file`) keeps
//! them: never the token, only its digest. The server compares presented
//! tokens against these digests and `tumbler token` writes them, both
//! through [`digest`], so an entry the command makes is one the server
//! accepts. Behind the `tokens` feature (it adds `sha2` and `hex`).

use sha2::{Digest, Sha256};

/// The digest a tokens file's `sha256` field holds for `token`: SHA-256 of
/// its bytes, in lowercase hex.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn digest_is_lowercase_hex_sha256() {
        assert_eq!(
            super::digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
