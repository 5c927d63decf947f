//! The join token of `<cluster>-token` (key `value`): 16 random bytes from the
//! OS CSPRNG, hex encoded, as upstream cluster-api-k3s pkg/token makes it.

use std::fmt::Write as _;

/// Number of random bytes in a token.
const TOKEN_BYTES: usize = 16;

/// A new join token: 32 lowercase hex characters from 16 bytes of the OS
/// CSPRNG. Panics only if the operating system cannot provide randomness,
/// where no secret could be made safely anyway.
pub fn generate_token() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).expect("the OS random number generator is unavailable");
    bytes
        .iter()
        .fold(String::with_capacity(2 * TOKEN_BYTES), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_32_lowercase_hex_chars_and_tokens_differ() {
        let first = generate_token();
        assert_eq!(first.len(), 32, "{first}");
        assert!(
            first
                .bytes()
                .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "{first}"
        );
        let more: std::collections::BTreeSet<String> = (0..64).map(|_| generate_token()).collect();
        assert_eq!(more.len(), 64, "64 tokens, all different");
        assert!(!more.contains(&first));
        // Every hex digit shows up across 64 tokens (2048 digits): not stuck.
        let digits: std::collections::BTreeSet<char> =
            more.iter().flat_map(|t| t.chars()).collect();
        assert_eq!(digits.len(), 16, "{digits:?}");
    }
}
