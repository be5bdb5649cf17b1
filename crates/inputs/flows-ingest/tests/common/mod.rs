//! Helpers shared by this crate's tests.

/// One IPFIX message (RFC 7011 §3.1): version 10, its length, the export
/// time, sequence 0, the observation domain, then each `(set id, body)` as a
/// set with its header.
pub fn ipfix_message(export: u32, domain: u32, sets: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&10u16.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&export.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&domain.to_be_bytes());
    for (id, body) in sets {
        b.extend_from_slice(&id.to_be_bytes());
        b.extend_from_slice(&((body.len() + 4) as u16).to_be_bytes());
        b.extend_from_slice(body);
    }
    let len = b.len() as u16;
    b[2..4].copy_from_slice(&len.to_be_bytes());
    b
}
