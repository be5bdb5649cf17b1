//! Without an output directory the plugin turns itself off (one line on
//! stderr) and NCCL gets success and an empty activation mask: the job runs
//! as if no plugin were loaded. Its own process: the plugin's state is
//! per process.

use std::ffi::c_void;
use std::ptr::null_mut;

use whyslow_nccl::ncclProfiler_v4 as plugin;

#[test]
fn no_directory_no_events_and_success() {
    std::env::remove_var("WHYSLOW_NCCL_DIR");
    std::env::remove_var("WHYSLOW_AGENT_DIR");
    // SAFETY: valid out-pointers; null descriptors and handles are allowed
    // by the plugin and must be ignored.
    unsafe {
        let mut ctx: *mut c_void = null_mut();
        let mut mask = -1;
        assert_eq!(
            (plugin.init)(&mut ctx, &mut mask, c"dp".as_ptr(), 1, 1, 2, 0, None),
            0
        );
        assert_eq!(mask, 0, "no event activated");
        let mut h = 7usize as *mut c_void;
        assert_eq!((plugin.start_event)(ctx, &mut h, null_mut()), 0);
        assert!(h.is_null());
        assert_eq!((plugin.stop_event)(null_mut()), 0);
        assert_eq!((plugin.finalize)(ctx), 0);
    }
}
