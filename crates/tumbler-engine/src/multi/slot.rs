//! The Redis Cluster slot of a key, for a multi-lock's slot groups: the
//! order every caller takes them in.

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag (or
/// the whole key without one), mod 16384.
pub(super) fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = (bytes.iter().position(|&b| b == b'{'))
        .and_then(|open| {
            let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::cluster_slot;

    #[test]
    fn cluster_slots_are_redis_ones() {
        // Redis' CLUSTER KEYSLOT answers.
        assert_eq!(cluster_slot("foo"), 12182);
        assert_eq!(
            cluster_slot("{user1000}.following"),
            cluster_slot("user1000")
        );
        assert_eq!(cluster_slot("123456789"), 0x31C3 % 16384);
        assert_eq!(cluster_slot("foo{}bar"), cluster_slot("foo{}bar"));
    }
}
