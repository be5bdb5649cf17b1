//! Symbol files from the node to `whyslow server`'s store, keyed by
//! Build-ID (SysOM-AI §3.4: samples carry Build-ID and file offset, and the
//! central service names them from one store for the whole fleet).
//!
//! The agent sends, for each Build-ID in the profiles it uploads, the best
//! symbols the node has: the separate debug file that a `-dbg`/`-dbgsym`
//! package installs under `<debug-dir>/.build-id/xx/yyyy.debug` (full
//! symbol tables for stripped binaries, so the server names frames the node
//! could not), else the module file itself. It asks first (`GET`), so each
//! Build-ID crosses the network once per tenant, and reads a file one part
//! at a time, so a 500 MB library costs the agent one part of memory.

use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use whyslow_model::stack::{FrameKind, StackProfile};
use whyslow_stacks::elf::Segment;
use whyslow_stacks::symindex;

/// The part size the agent sends files in (the server takes up to 64 MiB).
pub const AGENT_PART_BYTES: usize = 8 << 20;
/// The server's most parts per file (`symbols::MAX_PARTS` there).
const MAX_PARTS: u64 = 1024;

/// Why a symbol file did not go.
#[derive(Debug)]
pub enum SendError {
    /// The server refused this file (4xx other than 401): the others still go.
    Refused(String),
    /// The server is away, overloaded or refuses us: later, all.
    Later(String),
    /// The file could not be read.
    Read(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Refused(s) | SendError::Later(s) | SendError::Read(s) => f.write_str(s),
        }
    }
}

/// What the server said of a Build-ID.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    /// It had the Build-ID already: nothing was sent.
    Had,
    /// The file went in `parts` parts and the server indexed it (its answer).
    Indexed { parts: usize, answer: String },
}

fn http_error(url: &str, e: ureq::Error) -> SendError {
    match e {
        ureq::Error::StatusCode(401) => SendError::Later(format!("HTTP 401 for {url}")),
        ureq::Error::StatusCode(code @ 400..=499) => {
            SendError::Refused(format!("HTTP {code} for {url}"))
        }
        ureq::Error::StatusCode(code) => SendError::Later(format!("HTTP {code} for {url}")),
        e => SendError::Later(format!("{url}: {e}")),
    }
}

/// Sends `file`, an ELF file whose Build-ID is `id`, to the symbol store of
/// `server` unless it has that Build-ID: in parts of `part_bytes` (at most
/// 64 MiB; more when the file would need over 1,024 parts), read one at a
/// time. `layout`: for a separate debug file, the load segments of the
/// program it belongs to. `agent` may answer statuses as errors or not.
pub fn send(
    agent: &ureq::Agent,
    server: &str,
    token: &str,
    id: &str,
    (file, layout): (&Path, Option<&[Segment]>),
    part_bytes: usize,
) -> Result<Sent, SendError> {
    let base = format!("{}/api/v1/symbols/{id}", server.trim_end_matches('/'));
    let auth = format!("Bearer {token}");
    let status = |r: Result<ureq::http::Response<ureq::Body>, ureq::Error>, url: &str| match r {
        Ok(mut r) if r.status().is_success() => Ok((
            r.status().as_u16(),
            r.body_mut().read_to_string().unwrap_or_default(),
        )),
        Ok(mut r) => {
            let code = r.status().as_u16();
            let body = r.body_mut().read_to_string().unwrap_or_default();
            Err(match http_error(url, ureq::Error::StatusCode(code)) {
                SendError::Refused(s) => SendError::Refused(format!("{s}: {}", body.trim())),
                SendError::Later(s) => SendError::Later(format!("{s}: {}", body.trim())),
                e => e,
            })
        }
        Err(e) => Err(http_error(url, e)),
    };
    match status(
        agent.get(&base).header("Authorization", &auth).call(),
        &base,
    ) {
        Ok(_) => return Ok(Sent::Had),
        Err(SendError::Refused(s)) if s.starts_with("HTTP 404") => {}
        Err(e) => return Err(e),
    }
    let read_err = |e: std::io::Error| SendError::Read(format!("{}: {e}", file.display()));
    let mut f = File::open(file).map_err(read_err)?;
    let len = f.metadata().map_err(read_err)?.len();
    let part = (part_bytes.max(1) as u64).max(len.div_ceil(MAX_PARTS));
    let of = len.div_ceil(part).max(1);
    let mut buf = Vec::with_capacity(part.min(len.max(1)) as usize);
    let mut answer = String::new();
    for i in 0..of {
        buf.clear();
        (&mut f)
            .take(part)
            .read_to_end(&mut buf)
            .map_err(read_err)?;
        if buf.is_empty() && len > 0 {
            return Err(SendError::Read(format!(
                "{}: shorter than its {len} bytes (changed while read)",
                file.display()
            )));
        }
        let mut url = format!("{base}/parts/{i}?of={of}");
        if let Some(l) = layout {
            url.push_str("&segments=");
            url.push_str(&symindex::format_layout(l));
        }
        let (code, body) = status(
            agent
                .put(&url)
                .header("Authorization", &auth)
                .send(&buf[..]),
            &url,
        )?;
        if code == 201 {
            answer = body.trim().to_string();
        }
    }
    Ok(Sent::Indexed {
        parts: of as usize,
        answer,
    })
}

/// A file holding the symbols of one Build-ID, and for a separate debug
/// file the load segments of the module it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The file to send.
    pub file: PathBuf,
    /// `Some` for a debug file: the module's load segments.
    pub layout: Option<Vec<Segment>>,
}

/// Where the node keeps symbols for Build-ID `id` of `module`: the separate
/// debug file `<debug_dir>/.build-id/<2 hex>/<rest>.debug` when one exists
/// with that Build-ID, else `module` itself. `None` when `module` no longer
/// has that Build-ID (a process may have mapped a file since replaced): the
/// frames' offsets are the module's, so its layout is needed either way.
pub fn locate(id: &str, module: &Path, debug_dir: &Path) -> Option<Located> {
    let matches = |p: &Path| {
        whyslow_stacks::elf::build_id_of(p)
            .ok()
            .flatten()
            .is_some_and(|b| b == id)
    };
    if !(module.is_absolute() && module.is_file() && matches(module)) {
        return None;
    }
    if id.len() > 2 && id.is_ascii() {
        let debug = debug_dir
            .join(".build-id")
            .join(&id[..2])
            .join(format!("{}.debug", &id[2..]));
        if debug.is_file() && matches(&debug) {
            if let Ok(layout) = symindex::layout_of(module) {
                return Some(Located {
                    file: debug,
                    layout: Some(layout),
                });
            }
        }
    }
    Some(Located {
        file: module.to_path_buf(),
        layout: None,
    })
}

/// The native modules of `profile` as (Build-ID, module path), once each.
pub fn modules(profile: &StackProfile) -> Vec<(String, PathBuf)> {
    let mut seen = HashSet::new();
    profile
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::Native)
        .filter_map(|f| Some((f.build_id.clone()?, PathBuf::from(f.module.as_deref()?))))
        .filter(|(id, _)| seen.insert(id.clone()))
        .collect()
}

/// How the agent uploads symbols: `--upload-symbols`.
#[derive(Debug, Clone)]
pub struct SymbolUploads {
    /// Root of the separate debug files (`/usr/lib/debug`).
    pub debug_dir: PathBuf,
    /// Files larger than this are not sent.
    pub max_bytes: u64,
}

/// The agent's side of the symbol store: which Build-IDs are settled (on the
/// server, sent, or with no file to send), so each is handled once.
#[derive(Debug)]
pub(crate) struct SymbolUploader {
    settings: SymbolUploads,
    settled: HashSet<String>,
}

/// What one pass of [`SymbolUploader::offer`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Offered {
    /// Build-IDs sent now, with the file each came from.
    pub sent: Vec<(String, PathBuf)>,
    /// Build-IDs the server had.
    pub had: usize,
    /// Build-IDs not sent, and why (no file, too large, refused, unreadable).
    pub skipped: Vec<String>,
}

impl SymbolUploader {
    pub(crate) fn new(settings: SymbolUploads) -> Self {
        SymbolUploader {
            settings,
            settled: HashSet::new(),
        }
    }

    /// Sends the symbols of the modules in `profile` that are not settled.
    /// `Err`: the server is away; what is not settled is offered again with
    /// a later profile.
    pub(crate) fn offer(
        &mut self,
        agent: &ureq::Agent,
        server: &str,
        token: &str,
        profile: &StackProfile,
    ) -> Result<Offered, String> {
        let mut out = Offered::default();
        for (id, module) in modules(profile) {
            if self.settled.contains(&id) {
                continue;
            }
            let Some(Located { file, layout }) = locate(&id, &module, &self.settings.debug_dir)
            else {
                out.skipped.push(format!(
                    "{id} ({}): the file has another Build-ID now, or is gone",
                    module.display()
                ));
                self.settled.insert(id);
                continue;
            };
            let len = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
            if len > self.settings.max_bytes {
                out.skipped.push(format!(
                    "{id} ({}): {len} bytes, over --upload-symbols-max-mib",
                    file.display()
                ));
                self.settled.insert(id);
                continue;
            }
            let what = (file.as_path(), layout.as_deref());
            match send(agent, server, token, &id, what, AGENT_PART_BYTES) {
                Ok(Sent::Had) => out.had += 1,
                Ok(Sent::Indexed { .. }) => out.sent.push((id.clone(), file)),
                Err(SendError::Later(why)) => return Err(why),
                Err(e) => out.skipped.push(format!("{id} ({}): {e}", file.display())),
            }
            self.settled.insert(id);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use whyslow_model::stack::{Frame, StackProfileBuilder};

    fn native(module: &str, id: Option<&str>, offset: u64) -> Frame {
        Frame {
            kind: FrameKind::Native,
            name: None,
            module: Some(module.into()),
            build_id: id.map(str::to_string),
            offset,
            line: None,
        }
    }

    #[test]
    fn modules_are_listed_once_per_build_id_and_only_native_ones() {
        let mut b = StackProfileBuilder::new();
        let stack = [
            Frame::label("main"),
            native("/usr/lib/libz.so.1", Some("aa11"), 0x10),
            native("/usr/lib/libz.so.1", Some("aa11"), 0x20),
            native("[anon]", None, 0x30),
        ];
        let ids = stack.into_iter().map(|f| b.frame(f)).collect();
        b.add(ids, 3);
        let train = b.frame(native("/opt/bin/train", Some("bb22"), 0x40));
        b.add(vec![train], 1);
        let mut got = modules(&b.finish(99.0, 0, 1));
        got.sort();
        assert_eq!(
            got,
            vec![
                ("aa11".to_string(), PathBuf::from("/usr/lib/libz.so.1")),
                ("bb22".to_string(), PathBuf::from("/opt/bin/train")),
            ]
        );
    }

    #[test]
    fn the_debug_file_is_preferred_and_a_replaced_module_is_not_sent() {
        let exe = std::env::current_exe().unwrap();
        let id = whyslow_stacks::elf::build_id_of(&exe)
            .unwrap()
            .expect("the test binary has a Build-ID");
        let dir =
            std::env::temp_dir().join(format!("whyslow-agent-symbols-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let itself = Located {
            file: exe.clone(),
            layout: None,
        };
        // No debug file: the module itself.
        assert_eq!(locate(&id, &exe, &dir), Some(itself.clone()));
        // A debug file under .build-id with the same Build-ID wins, with the
        // module's load segments.
        let debug = dir
            .join(".build-id")
            .join(&id[..2])
            .join(format!("{}.debug", &id[2..]));
        std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
        std::fs::copy(&exe, &debug).unwrap();
        let got = locate(&id, &exe, &dir).unwrap();
        assert_eq!(got.file, debug);
        assert_eq!(got.layout, Some(symindex::layout_of(&exe).unwrap()));
        // A file at that name with another Build-ID is not it.
        std::fs::write(&debug, b"not elf").unwrap();
        assert_eq!(locate(&id, &exe, &dir), Some(itself));
        // A module whose file changed (another Build-ID) gives nothing.
        assert_eq!(locate("00ff00ff", &exe, &dir), None);
        assert_eq!(locate(&id, Path::new("relative/path"), &dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
