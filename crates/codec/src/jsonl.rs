//! JSON lines: the batch format of collective records (SysOM-AI §3.2) and
//! OS signal readings (§3.1) as agents spool and upload them. Two readings
//! of one format: an upload is refused at its first bad line (the client
//! is told which), while stored or spooled batches are read leniently —
//! what parses is kept, what does not is counted — so one bad line never
//! loses the rest of the evidence.

/// Every value of `text`, one JSON value per non-blank line; the first
/// line that is not a `T` is the error, as `line N: not WHAT: why`.
pub fn parse_jsonl<T: serde::de::DeserializeOwned>(
    text: &str,
    what: &str,
) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(line).map_err(|e| format!("line {}: not {what}: {e}", i + 1))?,
        );
    }
    Ok(out)
}

/// What a lenient read kept and left out.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonlValues<T> {
    /// The values that parsed, in order.
    pub values: Vec<T>,
    /// The lines that did not: `line N: why`, numbered within their batch.
    pub bad: Vec<String>,
}

impl<T> Default for JsonlValues<T> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            bad: Vec::new(),
        }
    }
}

impl<T: serde::de::DeserializeOwned> JsonlValues<T> {
    /// Adds the lines of one batch (blank lines are skipped).
    pub fn push_batch(&mut self, text: &str) {
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<T>(line) {
                Ok(v) => self.values.push(v),
                Err(e) => self.bad.push(format!("line {}: {e}", n + 1)),
            }
        }
    }

    /// The values of every batch in `batches`.
    pub fn of_batches<S: AsRef<str>>(batches: &[S]) -> Self {
        let mut out = Self::default();
        for b in batches {
            out.push_batch(b.as_ref());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_is_refused_at_its_first_bad_line_and_a_batch_keeps_the_rest() {
        let text = "1\n\n2\nx\n3\n";
        let err = parse_jsonl::<u32>(text, "a number").unwrap_err();
        assert!(err.starts_with("line 4: not a number"), "{err}");
        assert_eq!(parse_jsonl::<u32>("1\n 2 \n", "n").unwrap(), vec![1, 2]);
        let kept = JsonlValues::<u32>::of_batches(&[text, "4\n{}"]);
        assert_eq!(kept.values, vec![1, 2, 3, 4]);
        assert_eq!(kept.bad.len(), 2);
        assert!(kept.bad[0].starts_with("line 4:"), "{:?}", kept.bad);
        assert!(kept.bad[1].starts_with("line 2:"), "{:?}", kept.bad);
    }
}
