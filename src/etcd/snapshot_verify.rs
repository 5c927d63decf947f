//! Checking an etcd snapshot stream as it passes.
//!
//! etcd's `Maintenance.Snapshot` sends the backend database and then, as the
//! last 32 bytes, the SHA-256 of everything before them; `etcdutl snapshot
//! restore` accepts a file only when its size modulo 512 is 32 (a database of
//! whole pages plus that hash) and the hash matches (docs/k3s.md, Snapshots).
//! [`StreamVerifier`] checks the same, chunk by chunk, holding back only the
//! last 32 bytes seen, so memory does not grow with the snapshot.

use std::fmt;

use ring::digest;

/// Length of the trailing SHA-256.
pub const HASH_LEN: usize = 32;

/// etcdutl's test for "has a hash": `size % 512 == 32`.
const SECTOR: u64 = 512;

/// A snapshot that checked out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Bytes in the stream, the trailing hash included (what is stored).
    pub size: u64,
    /// The SHA-256 of the database (= the trailing hash), lower-case hex.
    pub sha256: String,
}

/// Why a snapshot stream is not a whole etcd snapshot.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("too short to be an etcd snapshot: {size} bytes")]
    TooShort { size: u64 },
    #[error(
        "truncated: {size} bytes is not a whole database plus its 32-byte SHA-256 (size modulo 512 is {remainder}, not 32); etcdutl would refuse it"
    )]
    Truncated { size: u64, remainder: u64 },
    #[error(
        "checksum mismatch: the snapshot ends with SHA-256 {expected}, its content hashes to {actual}"
    )]
    ChecksumMismatch { expected: String, actual: String },
}

/// Feeds on a snapshot's bytes in order; [`Self::finish`] says whether they
/// were a whole, intact etcd snapshot.
pub struct StreamVerifier {
    hasher: digest::Context,
    /// The last bytes seen, not hashed yet: they may be the trailing hash.
    tail: [u8; HASH_LEN],
    tail_len: usize,
    total: u64,
}

impl fmt::Debug for StreamVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamVerifier")
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

impl Default for StreamVerifier {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamVerifier {
    pub fn new() -> Self {
        Self {
            hasher: digest::Context::new(&digest::SHA256),
            tail: [0; HASH_LEN],
            tail_len: 0,
            total: 0,
        }
    }

    /// Bytes fed so far.
    pub fn bytes_seen(&self) -> u64 {
        self.total
    }

    pub fn update(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if chunk.len() >= HASH_LEN {
            // What was held back is not the end: hash it, and hold back the
            // chunk's last 32 bytes instead.
            self.hasher.update(&self.tail[..self.tail_len]);
            let (body, tail) = chunk.split_at(chunk.len() - HASH_LEN);
            self.hasher.update(body);
            self.tail.copy_from_slice(tail);
            self.tail_len = HASH_LEN;
        } else {
            let mut joined = [0u8; 2 * HASH_LEN];
            joined[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
            joined[self.tail_len..self.tail_len + chunk.len()].copy_from_slice(chunk);
            let len = self.tail_len + chunk.len();
            let keep = len.min(HASH_LEN);
            self.hasher.update(&joined[..len - keep]);
            self.tail[..keep].copy_from_slice(&joined[len - keep..len]);
            self.tail_len = keep;
        }
    }

    /// Whether the bytes fed were a whole etcd snapshot with a matching hash.
    pub fn finish(self) -> Result<Verified, VerifyError> {
        let size = self.total;
        // A bolt database is at least a few 4 KiB pages.
        if size < SECTOR + HASH_LEN as u64 {
            return Err(VerifyError::TooShort { size });
        }
        let remainder = size % SECTOR;
        if remainder != HASH_LEN as u64 {
            return Err(VerifyError::Truncated { size, remainder });
        }
        let actual = hex(self.hasher.finish().as_ref());
        let expected = hex(&self.tail[..self.tail_len]);
        if actual != expected {
            return Err(VerifyError::ChecksumMismatch { expected, actual });
        }
        Ok(Verified {
            size,
            sha256: actual,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake snapshot: `pages` pages of 4 KiB, then their SHA-256.
    fn snapshot(pages: usize) -> Vec<u8> {
        let mut data: Vec<u8> = (0..pages * 4096).map(|i| (i * 7 % 251) as u8).collect();
        let hash = digest::digest(&digest::SHA256, &data);
        data.extend_from_slice(hash.as_ref());
        data
    }

    fn verify_in_chunks(data: &[u8], chunk: usize) -> Result<Verified, VerifyError> {
        let mut v = StreamVerifier::new();
        for c in data.chunks(chunk.max(1)) {
            v.update(c);
        }
        assert_eq!(v.bytes_seen(), data.len() as u64);
        v.finish()
    }

    #[test]
    fn a_whole_snapshot_verifies_whatever_the_chunking() {
        let data = snapshot(4);
        let expected = hex(&data[data.len() - HASH_LEN..]);
        for chunk in [1, 7, 31, 32, 33, 4096, 32 * 1024, data.len()] {
            let ok =
                verify_in_chunks(&data, chunk).unwrap_or_else(|e| panic!("chunk {chunk}: {e}"));
            assert_eq!(ok.size, data.len() as u64);
            assert_eq!(ok.sha256, expected, "chunk {chunk}");
        }
    }

    #[test]
    fn a_flipped_byte_is_a_checksum_mismatch() {
        for at in [0, 5000, 4 * 4096 - 1, 4 * 4096 + 3] {
            let mut data = snapshot(4);
            data[at] ^= 0x01;
            let err = verify_in_chunks(&data, 1000).unwrap_err();
            assert!(
                matches!(err, VerifyError::ChecksumMismatch { .. }),
                "byte {at}: {err}"
            );
        }
    }

    #[test]
    fn a_truncated_snapshot_is_truncated() {
        let data = snapshot(4);
        for cut in [1, 32, 100, 4096 + 32, 4096 + 100] {
            let err = verify_in_chunks(&data[..data.len() - cut], 333).unwrap_err();
            assert!(
                matches!(err, VerifyError::Truncated { .. }),
                "cut {cut}: {err}"
            );
        }
    }

    #[test]
    fn a_snapshot_cut_at_a_page_plus_32_bytes_is_a_checksum_mismatch() {
        // Cut so that the size still looks whole: the hash check catches it.
        let data = snapshot(4);
        let err = verify_in_chunks(&data[..2 * 4096 + HASH_LEN], 4096).unwrap_err();
        assert!(matches!(err, VerifyError::ChecksumMismatch { .. }), "{err}");
    }

    #[test]
    fn too_short_streams_are_refused() {
        for len in [0, 1, 32, 543] {
            let err = verify_in_chunks(&vec![0u8; len], 10).unwrap_err();
            assert_eq!(err, VerifyError::TooShort { size: len as u64 });
        }
    }
}
