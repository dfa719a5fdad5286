//! The two records tumbler keeps for a lock, decoded: a grant
//! (`slot|expires|token|acquired|ttl|kind[|epoch][\nmetadata]`, in the lock
//! hash's field `h:<holder>`; `slot` is `s1,s2,…` ascending for a grant of
//! several permits, decision 0075; an empty kind is `default`, an empty
//! `acquired` the token's own milliseconds: tokens are made from Redis'
//! clock in µs; `epoch` only on a session's grant, the epoch of the stream
//! that serves it, which only the functions read) and a waiter
//! (`priority|enqueued|wait_ms|fair|kind`, in the queue's records hash,
//! `fair` one character: `0`/`1` a plain request, `r`/`w` a fair read or
//! write request, `R` a reader with prefer_readers (barging), then the
//! weight's digits when it asks more than one permit (`13`: fair, three),
//! followed for a hand-over waiter by `|request|answer_by|ttl|epoch` and
//! the metadata after a newline, which only the functions read).
//! `lua/shared/records.lua` writes them; this is their one reader. Public so that
//! the fuzz targets (`fuzz/`) and property tests reach them.

use std::collections::BTreeMap;

use crate::store::StoreError;

use super::{Grant, LockMode, QueuedRequest};

use crate::names::DEFAULT_KIND;

fn kind_of(text: &str) -> String {
    match text {
        "" => DEFAULT_KIND.to_owned(),
        kind => kind.to_owned(),
    }
}

/// Decodes the grant of `holder`. The kind never holds a newline, so the
/// newline before the metadata (JSON, absent when there is none) is
/// unambiguous.
pub fn parse_grant(holder: &str, record: &str) -> Result<Grant, StoreError> {
    let bad = || StoreError::Protocol(format!("grant record of {holder:?} not understood"));
    let (numbers, metadata) = match record.split_once('\n') {
        Some((numbers, json)) => (numbers, serde_json::from_str(json).map_err(|_| bad())?),
        None => (record, BTreeMap::new()),
    };
    let mut fields = numbers.splitn(6, '|');
    let mut next = || fields.next().ok_or_else(bad);
    let slots = parse_slots(next()?).ok_or_else(bad)?;
    let expires_at_ms = next()?.parse().map_err(|_| bad())?;
    let fencing_token: u64 = next()?.parse().map_err(|_| bad())?;
    let acquired_at_ms = match next()? {
        "" => i64::try_from(fencing_token / 1000).map_err(|_| bad())?,
        acquired => acquired.parse().map_err(|_| bad())?,
    };
    let ttl_ms = next()?.parse().map_err(|_| bad())?;
    // The kind, and a session grant's epoch after it (digits only).
    let last = next()?;
    let kind = match last.split_once('|') {
        Some((kind, epoch)) if !epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_digit()) => {
            kind
        }
        Some(_) => return Err(bad()),
        None => last,
    };
    let kind = kind_of(kind);
    let mut metadata: BTreeMap<String, String> = metadata;
    let proof = metadata.remove(crate::election::PROOF_KEY);
    Ok(Grant {
        holder: holder.to_owned(),
        fencing_token,
        slot: slots[0],
        permits: u32::try_from(slots.len()).map_err(|_| bad())?,
        slots,
        acquired_at_ms,
        expires_at_ms,
        ttl_ms,
        kind,
        metadata,
        mode: LockMode::Plain,
        proof,
    })
}

/// A grant's slot field: one slot, or `s1,s2,…` strictly ascending (one
/// per permit, decision 0075).
fn parse_slots(field: &str) -> Option<Vec<u32>> {
    let mut slots = Vec::new();
    for part in field.split(',') {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let slot: u32 = part.parse().ok()?;
        if slots.last().is_some_and(|&last| last >= slot) {
            return None;
        }
        slots.push(slot);
    }
    Some(slots)
}

/// The waiter record's `fair` field: whether the request takes its turn,
/// what it asks for (decision 0074) and how many permits (its digits after
/// the character, only when more than one: decision 0075).
fn fair_and_mode(field: &str) -> Option<(bool, LockMode, u32)> {
    let (first, weight) = field.split_at_checked(1)?;
    let (fair, mode) = match first {
        "0" => (false, LockMode::Plain),
        "1" => (true, LockMode::Plain),
        "r" => (true, LockMode::Read),
        "R" => (false, LockMode::Read),
        "w" => (true, LockMode::Write),
        _ => return None,
    };
    let permits = match weight {
        "" => 1,
        digits if mode == LockMode::Plain && digits.bytes().all(|b| b.is_ascii_digit()) => {
            match digits.parse().ok()? {
                0 | 1 => return None,
                k => k,
            }
        }
        _ => return None,
    };
    Some((fair, mode, permits))
}

/// The lock's rule from its header's limit field: a leading `r` or `w`
/// marks a read/write lock (read-held or only waited for; write-held).
pub fn header_mode(limit_field: &str) -> LockMode {
    match limit_field.as_bytes().first() {
        Some(b'r') => LockMode::Read,
        Some(b'w') => LockMode::Write,
        _ => LockMode::Plain,
    }
}

/// The metadata argument of an acquire: JSON, or nothing when empty (the
/// record then carries none). A map of strings always serializes: serde_json
/// fails only on a failing `Serialize` or a map key that is not a string.
pub fn metadata_arg(metadata: &BTreeMap<String, String>) -> String {
    if metadata.is_empty() {
        return String::new();
    }
    serde_json::to_string(metadata).expect("a map of strings serializes to JSON")
}

/// Decodes a waiter record of request `holder` at `position`, whose
/// liveness deadline is `expires_at_ms`.
pub fn parse_waiter(
    holder: &str,
    record: &str,
    expires_at_ms: i64,
    position: u32,
) -> Result<QueuedRequest, StoreError> {
    let bad = || StoreError::Protocol(format!("waiter record of {holder:?} not understood"));
    // A hand-over waiter's parts after the kind are the functions' only.
    let numbers = record
        .split_once('\n')
        .map_or(record, |(numbers, _)| numbers);
    let mut fields = numbers.split('|');
    let mut next = || fields.next().ok_or_else(bad);
    let priority = next()?.parse().map_err(|_| bad())?;
    let enqueued_at_ms: i64 = next()?.parse().map_err(|_| bad())?;
    let wait_ms: i64 = next()?.parse().map_err(|_| bad())?;
    let (fair, mode, permits) = fair_and_mode(next()?).ok_or_else(bad)?;
    Ok(QueuedRequest {
        holder: holder.to_owned(),
        position,
        priority,
        enqueued_at_ms,
        wait_deadline_ms: enqueued_at_ms.saturating_add(wait_ms),
        fair,
        kind: kind_of(next()?),
        expires_at_ms,
        mode,
        permits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_record_round_trips_holders_and_metadata_with_separators() {
        let grant = parse_grant(
            "w|1",
            "3|1732230005000|1732230000000001|1732230000000|5000|jobs\n{\"a|b\":\"c|d\"}",
        )
        .unwrap();
        assert_eq!(grant.holder, "w|1");
        assert_eq!(grant.fencing_token, 1_732_230_000_000_001);
        assert_eq!(grant.slot, 3);
        assert_eq!(grant.expires_at_ms, 1_732_230_005_000);
        assert_eq!(grant.ttl_ms, 5000);
        assert_eq!(grant.kind, "jobs");
        assert_eq!(grant.metadata.get("a|b").map(String::as_str), Some("c|d"));
        let bare = parse_grant("h|x", "1|9|8|7|6|").unwrap();
        assert_eq!(bare.holder, "h|x");
        let from_token = parse_grant("h", "1|1732230005000|1732230000123456||5000|").unwrap();
        assert_eq!(from_token.acquired_at_ms, 1_732_230_000_123);
        assert_eq!(bare.kind, "default");
        assert!(bare.metadata.is_empty());
        // A session's grant carries its stream's epoch after the kind.
        let session = parse_grant("s", "1|9|8|7|6|jobs|3\n{\"a\":\"b\"}").unwrap();
        assert_eq!((session.kind.as_str(), session.fencing_token), ("jobs", 8));
        assert_eq!(session.metadata.get("a").map(String::as_str), Some("b"));
        assert_eq!(parse_grant("s", "1|9|8|7|6||12").unwrap().kind, "default");
    }

    #[test]
    fn waiter_record_gives_its_wait_deadline_and_default_kind() {
        let waiter = parse_waiter("w|1", "-5|1732230000000|2500|1|", 1732230009000, 2).unwrap();
        assert_eq!(waiter.priority, -5);
        assert_eq!(waiter.enqueued_at_ms, 1_732_230_000_000);
        assert_eq!(waiter.wait_deadline_ms, 1_732_230_002_500);
        assert!(waiter.fair);
        assert_eq!(waiter.kind, "default");
        assert_eq!(waiter.position, 2);
        let jobs = parse_waiter("w", "0|1|2|0|jobs", 3, 1).unwrap();
        assert_eq!((jobs.fair, jobs.kind.as_str()), (false, "jobs"));
        // A hand-over waiter's record names its request, answer-by, ttl,
        // epoch and metadata after the kind.
        let handed =
            parse_waiter("w", "0|1|2|1|jobs|ab12.7|99|30000|\n{\"a\":\"b\"}", 3, 1).unwrap();
        assert_eq!((handed.fair, handed.kind.as_str()), (true, "jobs"));
        let plain = parse_waiter("w", "0|1|2|1||ab12.7|99|30000|4", 3, 1).unwrap();
        assert_eq!(plain.kind, "default");
        assert!(parse_waiter("w", "0|x|2|0|", 3, 1).is_err());
        // Read/write requests: the fair field says the mode too.
        let reader = parse_waiter("w", "0|1|2|r|", 3, 1).unwrap();
        assert_eq!((reader.fair, reader.mode), (true, LockMode::Read));
        let barging = parse_waiter("w", "0|1|2|R|jobs|ab.1|99|30000|", 3, 1).unwrap();
        assert_eq!((barging.fair, barging.mode), (false, LockMode::Read));
        let writer = parse_waiter("w", "0|1|2|w|", 3, 1).unwrap();
        assert_eq!((writer.fair, writer.mode), (true, LockMode::Write));
        assert_eq!(jobs.mode, LockMode::Plain);
        assert!(parse_waiter("w", "0|1|2|x|", 3, 1).is_err());
    }

    #[test]
    fn a_weighted_grant_holds_one_slot_per_permit_and_a_weighted_waiter_says_its_weight() {
        // Decision 0075: 's1,s2,…' ascending; the first is `slot`.
        let grant = parse_grant("h", "2,4,5|9|8|7|6|jobs").unwrap();
        assert_eq!((grant.slot, grant.permits), (2, 3));
        assert_eq!(grant.slots, vec![2, 4, 5]);
        let one = parse_grant("h", "3|9|8|7|6|").unwrap();
        assert_eq!((one.slot, one.permits, one.slots), (3, 1, vec![3]));
        for bad in [
            "2,|9|8|7|6|",
            ",2|9|8|7|6|",
            "4,2|9|8|7|6|",
            "2,2|9|8|7|6|",
            "2,,3|9|8|7|6|",
        ] {
            assert!(parse_grant("h", bad).is_err(), "{bad}");
        }
        // The fair field: its character, then the weight's digits.
        let waiter = parse_waiter("w", "0|1|2|13|jobs|ab.1|99|30000|", 3, 1).unwrap();
        assert_eq!(
            (waiter.fair, waiter.mode, waiter.permits),
            (true, LockMode::Plain, 3)
        );
        let barging = parse_waiter("w", "0|1|2|012|", 3, 1).unwrap();
        assert_eq!((barging.fair, barging.permits), (false, 12));
        assert_eq!(parse_waiter("w", "0|1|2|1|", 3, 1).unwrap().permits, 1);
        // A weight is written only past one, and only for a plain request.
        for bad in [
            "0|1|2|11|",
            "0|1|2|10|",
            "0|1|2|r3|",
            "0|1|2|w2|",
            "0|1|2|1x|",
        ] {
            assert!(parse_waiter("w", bad, 3, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn malformed_grant_record_is_a_protocol_error() {
        assert!(parse_grant("h", "1|12|x|3|4|k").is_err());
        assert!(parse_grant("h", "1|12|1|3").is_err());
        assert!(parse_grant("h", "1|12|1|3|4|k\nnot json").is_err());
        assert!(parse_grant("h", "1|12|1|3|4|k|").is_err());
        assert!(parse_grant("h", "1|12|1|3|4|k|x1").is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    use crate::test_support::proptest_config as config;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn records_of_any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_grant("h", &text);
            let _ = parse_waiter("h", &text, 0, 1);
        }

        #[test]
        fn grant_records_round_trip_holders_metadata_separators_and_unicode(
            expires in 0..i64::MAX,
            token in any::<u64>(),
            slot in any::<u32>(),
            acquired_at_ms in 0..i64::MAX,
            ttl_ms in any::<u64>(),
            kind in "[a-z0-9_.-]{1,32}",
            holder in "[^\\p{Cc}]{1,24}",
            metadata in proptest::collection::btree_map("[^\\p{Cc}]{1,16}|\\|+", "((?s:.)|\\||\\{|\\}|\"|\\\\){0,24}", 0..6),
        ) {
            // Written as lua/shared/records.lua's format_grant writes it.
            let json = metadata_arg(&metadata);
            let mut record = format!("{slot}|{expires}|{token}|{acquired_at_ms}|{ttl_ms}|{kind}");
            if !json.is_empty() {
                record = format!("{record}\n{json}");
            }
            let grant = parse_grant(&holder, &record).unwrap();
            prop_assert_eq!(grant.expires_at_ms, expires);
            prop_assert_eq!(grant.fencing_token, token);
            prop_assert_eq!(grant.slot, slot);
            prop_assert_eq!(grant.acquired_at_ms, acquired_at_ms);
            prop_assert_eq!(grant.ttl_ms, ttl_ms);
            prop_assert_eq!(grant.kind, kind);
            prop_assert_eq!(grant.holder, holder);
            prop_assert_eq!(grant.metadata, metadata);
        }

        #[test]
        fn weighted_grant_and_waiter_records_round_trip(
            first in 1u32..1000,
            gaps in proptest::collection::vec(1u32..50, 0..12),
            fair in any::<bool>(),
            permits in 2u32..10_000,
            token in any::<u64>(),
        ) {
            // Slots as lua/shared/permits.lua's free_slots writes them: ascending.
            let mut slots = vec![first];
            for gap in gaps {
                slots.push(slots.last().unwrap() + gap);
            }
            let text = slots.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let grant = parse_grant("h", &format!("{text}|9|{token}||6|")).unwrap();
            prop_assert_eq!(grant.slot, first);
            prop_assert_eq!(grant.permits as usize, slots.len());
            prop_assert_eq!(grant.slots, slots);
            // A waiter's fair field as acquire.lua writes it for k > 1.
            let field = format!("{}{permits}", if fair { '1' } else { '0' });
            let waiter = parse_waiter("w", &format!("0|1|2|{field}|"), 3, 1).unwrap();
            prop_assert_eq!((waiter.fair, waiter.permits), (fair, permits));
        }
    }
}
