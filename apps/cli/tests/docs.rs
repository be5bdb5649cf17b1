//! The reference pages (`docs/commands/*.md`) against the binary: every
//! option a page shows in a `whyslow …` usage exists in that command's
//! `--help`, and every page's command exists (issue 30: the docs' command
//! examples checked in CI).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn help(words: &[&str]) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .args(words)
        .arg("--help")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Inline code spans of `text` (between single backticks).
fn spans(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split('`').collect();
        for (i, p) in parts.iter().enumerate() {
            if i % 2 == 1 {
                out.push(p.replace("\\|", "|"));
            }
        }
    }
    out
}

#[test]
fn every_option_a_command_page_shows_is_in_its_help() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/commands");
    let mut checked = 0;
    let mut cache: BTreeMap<Vec<String>, Option<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("docs/commands") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for span in spans(&text) {
            let Some(rest) = span.strip_prefix("whyslow ") else {
                continue;
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            let Some(first) = words.first() else { continue };
            // `analyze|localize …`: both commands' options count.
            let mut helps = Vec::new();
            for cmd in first.split('|') {
                let mut path_words = vec![cmd.to_string()];
                let top = cache
                    .entry(path_words.clone())
                    .or_insert_with(|| help(&[cmd]))
                    .clone();
                let Some(top) = top else {
                    problems.push(format!("{}: `whyslow {cmd}` is no command", path.display()));
                    continue;
                };
                helps.push(top);
                // Subcommands (`server token create`, `flows analyze`).
                for w in words.iter().skip(1) {
                    if !w.chars().all(|c| c.is_ascii_lowercase() || c == '-') || w.starts_with('-')
                    {
                        break;
                    }
                    path_words.push(w.to_string());
                    let refs: Vec<&str> = path_words.iter().map(String::as_str).collect();
                    match cache
                        .entry(path_words.clone())
                        .or_insert_with(|| help(&refs))
                        .clone()
                    {
                        Some(h) => helps.push(h),
                        None => break,
                    }
                }
            }
            let all = helps.join("\n");
            for flag in rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
                if flag.len() > 2 && flag.starts_with("--") {
                    checked += 1;
                    if !all.contains(flag) {
                        problems.push(format!(
                            "{}: `{span}`: {flag} is not in its --help",
                            path.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} options found in docs/commands"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
