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

/// Long options (`--name`) that a `--help` text lists.
fn options_in_help(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if !t.starts_with('-') {
            continue;
        }
        // `-x, --long <VALUE>  what it does`: the option's own words come
        // before its description.
        for word in t.split(|c: char| c.is_whitespace() || c == ',' || c == '=') {
            if word.is_empty() || word.starts_with(['<', '[']) {
                continue;
            }
            if !word.starts_with('-') {
                break;
            }
            if word.len() > 2 && word.starts_with("--") && word != "--help" && word != "--version" {
                out.push(word.to_string());
            }
        }
    }
    out
}

/// The subcommands a `--help` text lists (clap's `Commands:` section).
fn subcommands_in_help(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect()
}

/// The other way (issue 47): every option a command's `--help` lists (and
/// its subcommands') is documented on that command's page,
/// `docs/commands/<command>.md`.
#[test]
fn every_option_in_a_commands_help_is_on_its_page() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/commands");
    let top = help(&[]).expect("whyslow --help");
    let mut problems = Vec::new();
    let mut checked = 0;
    for cmd in subcommands_in_help(&top) {
        let page = dir.join(format!("{cmd}.md"));
        let Ok(text) = std::fs::read_to_string(&page) else {
            problems.push(format!("`whyslow {cmd}` has no page {}", page.display()));
            continue;
        };
        let mut paths = vec![vec![cmd.clone()]];
        while let Some(words) = paths.pop() {
            let refs: Vec<&str> = words.iter().map(String::as_str).collect();
            let Some(h) = help(&refs) else { continue };
            for sub in subcommands_in_help(&h) {
                let mut w = words.clone();
                w.push(sub);
                paths.push(w);
            }
            for flag in options_in_help(&h) {
                checked += 1;
                let documented = text.match_indices(flag.as_str()).any(|(i, _)| {
                    !text[i + flag.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
                });
                if !documented {
                    problems.push(format!(
                        "`whyslow {}` {flag}: not on {}",
                        words.join(" "),
                        page.display()
                    ));
                }
            }
        }
    }
    // README's command list: every command, and no command that is not.
    let readme = std::fs::read_to_string(dir.join("../../README.md")).expect("README.md");
    let commands = subcommands_in_help(&top);
    for cmd in &commands {
        if !readme.contains(&format!("[{cmd}](docs/commands/{cmd}.md)")) {
            problems.push(format!("README.md does not list `whyslow {cmd}`"));
        }
    }
    for (i, _) in readme.match_indices("](docs/commands/") {
        let name = readme[i + 16..].split(".md").next().unwrap_or_default();
        let label = readme[..i].rsplit('[').next().unwrap_or_default();
        if label == name && !commands.iter().any(|c| c == name) {
            problems.push(format!(
                "README.md lists `whyslow {name}`, which is no command"
            ));
        }
    }
    assert!(checked > 60, "only {checked} options found in --help");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
