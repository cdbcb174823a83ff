//! Thread priorities: work nobody waits for directly (compressing memtables, analytical
//! queries) yields the cores to the write path, whose appends and fsyncs clients wait for.
//!
//! Written by hand: one `setpriority` call; a crate for it would be more than the call.

/// Lowers the calling thread's priority to `nice` (0 is normal, 19 the lowest). With nice
/// 10 the scheduler gives a thread about a tenth of a contended core and all of an idle one.
/// Lowering one's own priority needs no privilege; on Linux a nice value belongs to a
/// thread. Elsewhere this does nothing.
pub fn lower_own_priority(nice: i32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: setpriority only reads its arguments; gettid names the calling thread.
        let failed =
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) }
                != 0;
        if failed {
            return Err(std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
    Ok(())
}
