//! Helpers shared by the renderers.

use whyslow_model::stack::{Frame, FrameKind, StackProfile};

/// What a frame index outside [`StackProfile::frames`] renders as.
static MISSING: Frame = Frame {
    kind: FrameKind::Native,
    name: None,
    module: None,
    build_id: None,
    offset: 0,
    line: None,
};

/// The frame `id` of `profile`, or an unknown native frame when `id` is out
/// of range (a hand-built profile may hold any index).
pub(crate) fn frame_at(profile: &StackProfile, id: u32) -> &Frame {
    profile.frames.get(id as usize).unwrap_or(&MISSING)
}

/// Total samples, adding up saturating (unlike [`StackProfile::total`],
/// which may overflow on hostile counts).
pub(crate) fn total(profile: &StackProfile) -> u64 {
    profile
        .stacks
        .iter()
        .fold(0u64, |acc, s| acc.saturating_add(s.count))
}

/// The sampling rate when it is usable (finite and positive).
pub(crate) fn usable_hz(profile: &StackProfile) -> Option<f64> {
    (profile.hz.is_finite() && profile.hz > 0.0).then_some(profile.hz)
}
