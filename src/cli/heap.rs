//! How `run` sets up glibc's heap: the heap does not grow for allocations of
//! 8 KiB and more; they get mappings of their own.
//!
//! Every held connection (three etcd members and the workload API per
//! cluster) keeps buffers of fixed size that an idle pass writes only the
//! first bytes of: h2's 16 KiB write buffer, tokio-util's 8 KiB read buffer.
//! Carved from the heap, they land on pages earlier allocations touched and
//! are resident whole; when a connection is replaced (its client certificate
//! renewed) they leave holes among live blocks that the heap cannot hand back.
//! In a mapping of its own a buffer holds only the pages written, and goes
//! back to the system when freed. glibc's default threshold (128 KiB, raised
//! as large blocks are freed) catches none of them. Below the threshold
//! glibc still serves a large block from the free end of the heap when that
//! has room (the heap's own padding); it no longer grows the heap for one.
//!
//! `MALLOC_MMAP_THRESHOLD_` in the environment wins: glibc reads it at start,
//! and it is left as the operator set it.

/// From this size up, glibc does not grow the heap for an allocation: it maps
/// it on its own, unless the heap's free end still has room for it.
pub const MMAP_THRESHOLD: usize = 8 * 1024;

/// What [`serve_large_allocations_from_own_mappings`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum HeapSetup {
    /// glibc takes allocations of [`MMAP_THRESHOLD`] bytes and more from
    /// their own mappings.
    Set,
    /// `MALLOC_MMAP_THRESHOLD_` is set: glibc already follows it.
    LeftToEnvironment,
    /// Not glibc, or glibc refused.
    Unchanged,
}

/// Set glibc's mmap threshold to [`MMAP_THRESHOLD`] (which also stops it
/// from moving), unless the environment sets one.
pub fn serve_large_allocations_from_own_mappings() -> HeapSetup {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return HeapSetup::LeftToEnvironment;
    }
    set_threshold()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_threshold() -> HeapSetup {
    // SAFETY: mallopt only changes allocator parameters; glibc takes its
    // arena lock while doing so, so it may be called with other threads
    // allocating.
    let done = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) };
    if done == 1 {
        HeapSetup::Set
    } else {
        HeapSetup::Unchanged
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_threshold() -> HeapSetup {
    HeapSetup::Unchanged
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// glibc serves an mmapped block 16 bytes (its chunk header) past a page
    /// boundary; a heap block is there by chance one time in 256.
    fn in_a_mapping_of_its_own(block: &[u8]) -> bool {
        block.as_ptr() as usize % 4096 == 16
    }

    /// Set in the child process the test below runs itself in.
    const CHILD: &str = "K3SCP_HEAP_TEST_CHILD";

    /// After the setup, buffers the size of h2's read and write buffers get
    /// mappings of their own once the free end of the heap (at most glibc's
    /// 128 KiB padding) is used up: of 64 (768 KiB), at least 32. Before
    /// it, the heap grows for them and none does (by chance, one in 256 each).
    ///
    /// In a process of its own (this test binary again, this test only):
    /// in the shared one, blocks other tests freed would serve the buffers.
    #[test]
    fn buffers_of_8_and_16_kib_get_mappings_of_their_own() {
        if std::env::var_os(CHILD).is_none() {
            let name = "cli::heap::tests::buffers_of_8_and_16_kib_get_mappings_of_their_own";
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env_remove("MALLOC_MMAP_THRESHOLD_")
                .output()
                .expect("the test binary runs again");
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && text.contains("1 passed"),
                "in a process of its own: {text}"
            );
            return;
        }
        assert_eq!(serve_large_allocations_from_own_mappings(), HeapSetup::Set);
        let buffers: Vec<Vec<u8>> = [8 * 1024, 16 * 1024]
            .into_iter()
            .cycle()
            .take(64)
            .map(|size| vec![1u8; size])
            .collect();
        let mapped = buffers
            .iter()
            .filter(|b| in_a_mapping_of_its_own(b))
            .count();
        assert!(
            mapped >= buffers.len() / 2,
            "{mapped} of {} buffers in mappings of their own",
            buffers.len()
        );
    }
}
