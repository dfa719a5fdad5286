//! The rules of a multi-lock's request (decisions 0076, 0079): its
//! names, what it may not ask for, and the tokens that pin a set's
//! Release or Extend.

use super::{Invalid, LockName, invalid};

/// The most locks one multi-lock names (decision 0076).
pub const MAX_MULTI_NAMES: usize = 16;

/// Each name of a multi-lock as its refusal names it.
const NAMES_FIELDS: [&str; MAX_MULTI_NAMES] = [
    "names[0]",
    "names[1]",
    "names[2]",
    "names[3]",
    "names[4]",
    "names[5]",
    "names[6]",
    "names[7]",
    "names[8]",
    "names[9]",
    "names[10]",
    "names[11]",
    "names[12]",
    "names[13]",
    "names[14]",
    "names[15]",
];

/// A multi-lock's names (decision 0076): `name` empty, 2..=16 distinct
/// valid lock names; a bad one is named by its index (`names[2]: …`).
pub fn multi_names(name: &str, names: Vec<String>) -> Result<Vec<LockName>, Invalid> {
    if !name.is_empty() {
        return Err(invalid(
            "name",
            "must be empty when `names` is set (a multi-lock names its locks there)",
        ));
    }
    if !(2..=MAX_MULTI_NAMES).contains(&names.len()) {
        return Err(invalid(
            "names",
            format!(
                "a multi-lock names 2 to {MAX_MULTI_NAMES} locks (got {})",
                names.len()
            ),
        ));
    }
    let mut parsed: Vec<LockName> = Vec::with_capacity(names.len());
    for (i, value) in names.into_iter().enumerate() {
        let name = LockName::parse(value).map_err(|e| invalid(NAMES_FIELDS[i], e.rule))?;
        if let Some(j) = parsed.iter().position(|seen| *seen == name) {
            return Err(invalid(
                NAMES_FIELDS[i],
                format!("repeats names[{j}]; the names must be distinct"),
            ));
        }
        parsed.push(name);
    }
    Ok(parsed)
}

/// What a multi-lock may not ask for in this version: a read/write mode,
/// more than one permit per lock.
pub fn multi_plain(mode: i32, permits: Option<u32>) -> Result<(), Invalid> {
    if mode != 0 {
        return Err(invalid(
            "mode",
            "a multi-lock (`names`) takes no read/write mode",
        ));
    }
    if permits.is_some_and(|k| k > 1) {
        return Err(invalid(
            "permits",
            "a multi-lock (`names`) takes one permit of each lock",
        ));
    }
    Ok(())
}

/// A Release or Extend of a multi-lock's set: its names checked as an
/// Acquire's, and no fencing token (each lock has its own).
pub fn multi_set(
    name: &str,
    names: Vec<String>,
    fencing_token: Option<u64>,
) -> Result<Vec<LockName>, Invalid> {
    let names = multi_names(name, names)?;
    if fencing_token.is_some() {
        return Err(invalid(
            "fencing_token",
            "must be unset with `names` (each lock of the set has its own token)",
        ));
    }
    Ok(names)
}

/// A multi-lock Release's or Extend's `fencing_tokens` (decision 0079):
/// empty (any grant of the holder), or one token per name, in the order of
/// `names`, none of them 0. Paired with the names it pins.
pub fn set_tokens(
    names: Vec<LockName>,
    fencing_tokens: Vec<u64>,
) -> Result<Vec<(LockName, Option<u64>)>, Invalid> {
    if fencing_tokens.is_empty() {
        return Ok(names.into_iter().map(|name| (name, None)).collect());
    }
    if fencing_tokens.len() != names.len() {
        return Err(invalid(
            "fencing_tokens",
            format!(
                "must hold one token per name of `names`, in its order ({} names, {} tokens), or be empty to match any",
                names.len(),
                fencing_tokens.len()
            ),
        ));
    }
    if let Some(at) = fencing_tokens.iter().position(|&token| token == 0) {
        return Err(invalid(
            "fencing_tokens",
            format!("fencing_tokens[{at}] is 0: a token the server granted is never 0"),
        ));
    }
    Ok((names.into_iter())
        .zip(fencing_tokens.into_iter().map(Some))
        .collect())
}

/// A single lock's Release or Extend (`name`) takes no `fencing_tokens`:
/// they pin the locks of a set (`names`); its own is `fencing_token`.
pub fn no_set_tokens(fencing_tokens: &[u64]) -> Result<(), Invalid> {
    if fencing_tokens.is_empty() {
        return Ok(());
    }
    Err(invalid(
        "fencing_tokens",
        "must be empty without `names` (a single lock's token is `fencing_token`)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(of: &[&str]) -> Vec<LockName> {
        of.iter().map(|n| LockName::parse(*n).unwrap()).collect()
    }

    #[test]
    fn a_sets_tokens_pair_with_its_names_or_name_their_field() {
        let none = set_tokens(names(&["a", "b"]), Vec::new()).unwrap();
        assert_eq!(
            none,
            [
                (names(&["a"])[0].clone(), None),
                (names(&["b"])[0].clone(), None)
            ]
        );
        let pinned = set_tokens(names(&["a", "b"]), vec![7, 9]).unwrap();
        let tokens: Vec<Option<u64>> = pinned.iter().map(|(_, t)| *t).collect();
        assert_eq!(tokens, [Some(7), Some(9)]);
        for tokens in [vec![7], vec![7, 9, 11], vec![7, 0]] {
            let refused = set_tokens(names(&["a", "b"]), tokens.clone()).expect_err("refused");
            assert_eq!(refused.field, "fencing_tokens", "{tokens:?}: {refused}");
        }
        assert!(no_set_tokens(&[]).is_ok());
        assert_eq!(no_set_tokens(&[7]).unwrap_err().field, "fencing_tokens");
    }
}
