//! `--verify-fix -- CMD…`: whether a model's patch makes the user's own
//! command faster (issue 44; EROICA's first step, checked as performance
//! benchmarks check a change). The source root is copied twice into a
//! scratch directory, the patch applied to one copy
//! ([`whyslow_fix::apply_patch`]), and the command run in each copy in
//! turn, `runs` times each; the verdict is [`whyslow_fix::judge_rerun`]'s.
//! The user's files are never written.
//!
//! A run's figure is its wall time, unless the command measures itself: a
//! number of seconds written to the file named by [`MEASURE_ENV`] (the mean
//! step time after warm-up, say, without the interpreter's start-up)
//! counts instead.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use whyslow_model::fix::{FixVerification, VerifyStatus};

/// Directories left out of the scratch copies: version control, caches and
/// environments the command does not change (a virtualenv can be gigabytes).
pub const SKIPPED_DIRS: &[&str] = &[
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    "target",
];

/// The environment variable naming the file where a run may leave its own
/// figure (seconds) in place of its wall time.
pub const MEASURE_ENV: &str = "WHYSLOW_VERIFY_MEASURE";

/// What to rerun.
pub struct VerifyArgs<'a> {
    /// The source root the patch's paths are relative to.
    pub root: &'a Path,
    /// The command and its arguments, run in each copy of the root.
    pub command: &'a [String],
    /// Runs of each side (alternating before, after).
    pub runs: usize,
    /// Seconds one run may take before it counts as failed.
    pub run_timeout_s: f64,
}

/// Tries `patch` as [`VerifyArgs`] say; `progress` gets one line per run.
/// Every failure is a verdict (`no_patch`, `does_not_apply`, `run_failed`),
/// never an error.
pub fn verify(
    patch: Option<&str>,
    args: &VerifyArgs,
    progress: &mut dyn FnMut(&str),
) -> FixVerification {
    let Some(patch) = patch else {
        return whyslow_fix::not_verified(VerifyStatus::NoPatch, "the model proposed no change");
    };
    let Some(program) = args.command.first() else {
        return whyslow_fix::not_verified(VerifyStatus::RunFailed, "no command to run");
    };
    let read = |p: &str| -> Option<String> {
        safe_relative(p).and_then(|rel| fs::read_to_string(args.root.join(rel)).ok())
    };
    let files = match whyslow_fix::apply_patch(patch, &read) {
        Ok(f) => f,
        Err(e) => return whyslow_fix::not_verified(VerifyStatus::DoesNotApply, e),
    };
    let scratch = match tempfile::Builder::new().prefix("whyslow-verify-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            return whyslow_fix::not_verified(
                VerifyStatus::RunFailed,
                format!("scratch directory: {e}"),
            )
        }
    };
    let (before, after) = (scratch.path().join("before"), scratch.path().join("after"));
    let prepared = copy_tree(args.root, &before)
        .and_then(|_| copy_tree(args.root, &after))
        .map_err(|e| format!("copying {}: {e}", args.root.display()))
        .and_then(|_| write_patched(&after, &files));
    if let Err(e) = prepared {
        return whyslow_fix::not_verified(VerifyStatus::RunFailed, e);
    }
    let (mut before_s, mut after_s) = (Vec::new(), Vec::new());
    for run in 1..=args.runs {
        for (side, dir, times) in [
            ("before", &before, &mut before_s),
            ("after", &after, &mut after_s),
        ] {
            let log = scratch.path().join(format!("{side}-{run}.log"));
            match run_once(program, &args.command[1..], dir, &log, args.run_timeout_s) {
                Ok(s) => {
                    progress(&format!(
                        "verify-fix: run {run}/{} {side} the patch: {s:.2} s",
                        args.runs
                    ));
                    times.push(s);
                }
                Err(e) => {
                    return whyslow_fix::not_verified(
                        VerifyStatus::RunFailed,
                        format!("{program} {side} the patch (run {run}): {e}"),
                    )
                }
            }
        }
    }
    whyslow_fix::judge_rerun(&before_s, &after_s)
}

/// `p` as a path inside the root: relative, without `..`.
fn safe_relative(p: &str) -> Option<PathBuf> {
    let path = Path::new(p);
    path.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        .then(|| path.to_path_buf())
}

/// Writes the patched files into the copy `dir` (a `None` text deletes).
fn write_patched(dir: &Path, files: &[whyslow_fix::PatchedFile]) -> Result<(), String> {
    for (path, text) in files {
        let rel = safe_relative(path)
            .ok_or_else(|| format!("{path}: the patch names a path outside the source root"))?;
        let target = dir.join(rel);
        let done = match text {
            Some(t) => target
                .parent()
                .map_or(Ok(()), fs::create_dir_all)
                .and_then(|_| fs::write(&target, t)),
            None => fs::remove_file(&target),
        };
        done.map_err(|e| format!("{}: {e}", target.display()))?;
    }
    Ok(())
}

/// Copies `from` into `to` (files and directories; symlinks as links),
/// leaving out [`SKIPPED_DIRS`].
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let kind = entry.file_type()?;
        let dest = to.join(&name);
        if kind.is_dir() {
            if SKIPPED_DIRS.iter().any(|s| name == *s) {
                continue;
            }
            copy_tree(&entry.path(), &dest)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &dest)?;
        } else {
            fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

/// Runs the command once in `dir` (output to `log`), returning its wall
/// time; a non-zero exit or a run past `timeout_s` is an error naming the
/// exit and the output's last line.
fn run_once(
    program: &str,
    args: &[String],
    dir: &Path,
    log: &Path,
    timeout_s: f64,
) -> Result<f64, String> {
    let out = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let measure = log.with_extension("measure");
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env(MEASURE_ENV, &measure)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("could not start: {e}"))?;
    let limit = Duration::from_secs_f64(timeout_s.max(0.1));
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {timeout_s:.0} s"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    if status.success() {
        return match fs::read_to_string(&measure) {
            Err(_) => Ok(seconds),
            Ok(text) => match text.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 => Ok(s),
                _ => Err(format!(
                    "${MEASURE_ENV} holds {:?}, not seconds > 0",
                    text.trim()
                )),
            },
        };
    }
    let text = fs::read_to_string(log).unwrap_or_default();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(format!("{status}: {last}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(script: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("work.sh"), script).unwrap();
        fs::create_dir(d.path().join(".git")).unwrap();
        fs::write(d.path().join(".git").join("HEAD"), "x").unwrap();
        d
    }

    fn args<'a>(root: &'a Path, command: &'a [String], runs: usize) -> VerifyArgs<'a> {
        VerifyArgs {
            root,
            command,
            runs,
            run_timeout_s: 30.0,
        }
    }

    const SLOW: &str = "sleep 0.3\necho done\n";
    const PATCH: &str =
        "--- a/work.sh\n+++ b/work.sh\n@@ -1,2 +1,2 @@\n-sleep 0.3\n+sleep 0.05\n echo done\n";

    #[test]
    fn a_patch_that_makes_the_command_faster_is_verified_and_the_root_is_untouched() {
        let root = root_with(SLOW);
        let cmd = vec!["sh".to_string(), "work.sh".to_string()];
        let mut lines = Vec::new();
        let v = verify(Some(PATCH), &args(root.path(), &cmd, 5), &mut |l| {
            lines.push(l.to_string())
        });
        assert_eq!(v.status, VerifyStatus::Faster, "{v:?}");
        assert!(
            v.speedup.unwrap() > 2.0 && v.p_value.unwrap() < 0.01,
            "{v:?}"
        );
        assert_eq!((v.runs, lines.len()), (5, 10));
        assert_eq!(
            fs::read_to_string(root.path().join("work.sh")).unwrap(),
            SLOW
        );
    }

    #[test]
    fn a_command_that_measures_itself_is_judged_by_its_own_figure() {
        // Equal wall time, and the command's own figure says 2x.
        let root = root_with("echo 0.2 > \"$WHYSLOW_VERIFY_MEASURE\"\n");
        let patch = "--- a/work.sh\n+++ b/work.sh\n@@ -1 +1 @@\n-echo 0.2 > \"$WHYSLOW_VERIFY_MEASURE\"\n+echo 0.1 > \"$WHYSLOW_VERIFY_MEASURE\"\n";
        let cmd = vec!["sh".to_string(), "work.sh".to_string()];
        let v = verify(Some(patch), &args(root.path(), &cmd, 4), &mut |_| {});
        assert_eq!((v.before_s[0], v.after_s[0]), (0.2, 0.1), "{v:?}");
        assert_eq!(v.speedup, Some(2.0));
        // Ties on each side: the normal approximation, still significant.
        assert_eq!(v.status, VerifyStatus::Faster, "{v:?}");
    }

    #[test]
    fn no_change_a_patch_that_does_not_apply_or_a_failing_run_is_no_fix() {
        let root = root_with(SLOW);
        let cmd = vec!["sh".to_string(), "work.sh".to_string()];
        let mut quiet = |_: &str| {};
        // A patch that slows the command (equal work would be judged on
        // noise: p < 0.05 by chance one time in 35 with 4 runs a side).
        let slower = PATCH.replace("+sleep 0.05", "+sleep 0.5");
        let v = verify(Some(&slower), &args(root.path(), &cmd, 4), &mut quiet);
        assert_eq!(v.status, VerifyStatus::NotFaster, "{v:?}");
        let v = verify(None, &args(root.path(), &cmd, 4), &mut quiet);
        assert_eq!(v.status, VerifyStatus::NoPatch);
        let v = verify(
            Some(&PATCH.replace("sleep 0.3", "sleep 9")),
            &args(root.path(), &cmd, 4),
            &mut quiet,
        );
        assert_eq!(v.status, VerifyStatus::DoesNotApply);
        assert!(v.detail.unwrap().contains("hunk 1"));
        let broken = PATCH.replace("+sleep 0.05", "+exit 3");
        let v = verify(Some(&broken), &args(root.path(), &cmd, 4), &mut quiet);
        assert_eq!(v.status, VerifyStatus::RunFailed);
        assert!(
            v.detail.as_deref().unwrap().contains("after the patch"),
            "{v:?}"
        );
        let outside = PATCH.replace("a/work.sh", "a/../x.sh");
        let v = verify(Some(&outside), &args(root.path(), &cmd, 4), &mut quiet);
        assert_eq!(v.status, VerifyStatus::DoesNotApply, "{v:?}");
    }
}
