//! Clocks: the trace clock the samples are stamped on, and the monotonic clock
//! the sampler paces itself and measures intervals with.
//!
//! # Which clock the PyTorch profiler uses (verified against the fixtures)
//!
//! Kineto stamps events with the wall clock (`std::chrono::system_clock`, i.e.
//! `CLOCK_REALTIME` on Linux) in ns since the Unix epoch, and writes `ts` in µs.
//! Two layouts exist in `tests/fixtures/kineto/single`:
//!
//! - older traces (no `baseTimeNanoseconds`, e.g. `a100-rank3of8`,
//!   `v100-rank1of2`): `ts` is epoch µs (≈ 1.66·10^15);
//! - newer traces carry `"baseTimeNanoseconds"` and write `ts` *relative* to it
//!   (libkineto `transToRelativeTime`: `ts = epoch − base`, clamped at 0). The
//!   base is the wall clock floored to a multiple of 7 889 238 s ("3 months",
//!   libkineto `ChromeTraceBaseTime`). Every fixture with the field agrees:
//!   1711964646, 1719853884, 1735632360, 1751410836 and 1767189312 s are
//!   217, 218, 220, 222 and 224 × 7889238.
//!
//! whyslow-ingest does not add `baseTimeNanoseconds` (crates/inputs/ingest/src/kineto
//! docs): executions stay on the trace's own clock. So the sampler must stamp
//! samples with `CLOCK_REALTIME − base`, where base is 0 for old traces and
//! `baseTimeNanoseconds` for new ones: [`TimeBase`]. [`kineto_base_time_ns`]
//! computes the base the way libkineto does, which agrees with the trace
//! unless the profiled process started in a different 3-month window than the
//! sampler runs in; pass the trace's own value when it is known.

/// Seconds in libkineto's base-time rounding interval (`_trimonths`).
pub const KINETO_BASE_INTERVAL_S: i64 = 7_889_238;

/// The origin subtracted from `CLOCK_REALTIME` to stamp samples (see the
/// module docs of `clock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeBase {
    /// Unix epoch: traces without `baseTimeNanoseconds` (older PyTorch).
    #[default]
    UnixEpoch,
    /// Relative to a trace's `baseTimeNanoseconds` (newer PyTorch/Kineto).
    KinetoBase {
        /// The trace's `baseTimeNanoseconds`.
        base_ns: i64,
    },
}

impl TimeBase {
    /// The base as libkineto would compute it now (see [`kineto_base_time_ns`]).
    pub fn kineto_now() -> TimeBase {
        TimeBase::KinetoBase {
            base_ns: kineto_base_time_ns(realtime_ns()),
        }
    }

    /// Nanoseconds subtracted from `CLOCK_REALTIME`.
    pub fn offset_ns(self) -> i64 {
        match self {
            TimeBase::UnixEpoch => 0,
            TimeBase::KinetoBase { base_ns } => base_ns,
        }
    }
}

/// libkineto's `ChromeTraceBaseTime`: `epoch_ns` floored to a multiple of
/// [`KINETO_BASE_INTERVAL_S`] seconds.
pub fn kineto_base_time_ns(epoch_ns: i64) -> i64 {
    let interval_ns = KINETO_BASE_INTERVAL_S * 1_000_000_000;
    epoch_ns.div_euclid(interval_ns) * interval_ns
}

/// Moves samples stamped on one origin to another: subtracts `shift_ns`
/// from every timestamp (e.g. a trace's `baseTimeNanoseconds` from samples
/// stamped on the Unix epoch). The one place whyslow changes a samples
/// time base after sampling: the Python sampler's `write`, and the rank that
/// takes the agent's epoch-stamped samples onto its trace's origin.
pub fn rebase<'a>(series: impl IntoIterator<Item = &'a mut crate::SampleSeries>, shift_ns: i64) {
    if shift_ns == 0 {
        return;
    }
    for s in series {
        for t in s.ts_ns.iter_mut() {
            *t = t.saturating_sub(shift_ns);
        }
    }
}

fn clock_ns(id: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock ids used are
    // always supported on Linux, and on failure `ts` stays zeroed.
    unsafe { libc::clock_gettime(id, &mut ts) };
    // time_t / c_long are i32 on 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let ns = ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64;
    ns
}

/// `CLOCK_REALTIME` in ns since the Unix epoch (the clock Kineto uses).
pub fn realtime_ns() -> i64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// `CLOCK_MONOTONIC` in ns (pacing and interval lengths: immune to NTP steps).
pub fn monotonic_ns() -> i64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread in ns (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> i64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `deadline_ns` (absolute).
pub(crate) fn sleep_until_monotonic(deadline_ns: i64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be null
        // with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Lowers the calling thread's timer slack to 1 ns so that 100 µs sleeps
/// (10 kHz) are not stretched by the default 50 µs slack.
pub(crate) fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long; no pointers involved.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kineto_base_matches_fixture_values() {
        // baseTimeNanoseconds of the fixtures, and a ts inside each trace.
        for (base_s, rel_ts_us) in [
            (1_711_964_646_i64, 4_458_676_522_690_i64),
            (1_767_189_312, 1_365_627_862_757),
            (1_751_410_836, 1_428_625_731_896),
        ] {
            let epoch_ns = base_s * 1_000_000_000 + rel_ts_us * 1000;
            assert_eq!(kineto_base_time_ns(epoch_ns), base_s * 1_000_000_000);
        }
    }

    #[test]
    fn realtime_is_epoch_ns() {
        let now = realtime_ns();
        // After 2020-01-01 and before 2100.
        assert!(now > 1_577_836_800 * 1_000_000_000 && now < 4_102_444_800 * 1_000_000_000);
    }
}

#[cfg(test)]
mod rebase_tests {
    use super::*;
    use crate::SampleSeries;

    #[test]
    fn rebase_moves_every_stamp_and_zero_is_a_no_op() {
        let base = kineto_base_time_ns(1_767_189_312_123_456_789);
        let mut s = [SampleSeries {
            ts_ns: vec![base + 1_000, base + 2_500],
            values: vec![0.5, 1.0],
        }];
        rebase(s.iter_mut(), 0);
        assert_eq!(s[0].ts_ns, vec![base + 1_000, base + 2_500]);
        rebase(s.iter_mut(), base);
        assert_eq!(s[0].ts_ns, vec![1_000, 2_500]);
        rebase(s.iter_mut(), i64::MIN);
        assert_eq!(
            s[0].ts_ns,
            vec![i64::MAX, i64::MAX],
            "saturates, never wraps"
        );
    }
}
