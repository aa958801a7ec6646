//! What a runtime's image pull says about its progress, turned into the run's phase as
//! `gpuctl job get` shows it (`pulling image REF: copying layers (3)`). Pure: fed the pull's
//! output line by line.
//!
//! Podman 4.3 writes no byte counts when its output is not a terminal: only which layer it
//! starts copying, the config, the manifest, and each retry with its reason. That is what the
//! phase can tell.

use gpu_raft_store::MAX_PHASE_LEN;

/// The pull's progress so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PullProgress {
    image: String,
    step: Step,
    /// Layers started (not skipped).
    layers: u32,
    /// Layers the store already held.
    skipped: u32,
    /// The latest retry: `(1/3)` and the registry's reason.
    retry: Option<(String, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Connecting,
    Layers,
    Config,
    Storing,
}

impl PullProgress {
    pub(super) fn new(image: &str) -> Self {
        Self {
            image: image.to_owned(),
            step: Step::Connecting,
            layers: 0,
            skipped: 0,
            retry: None,
        }
    }

    /// One line of the runtime's output.
    pub(super) fn line(&mut self, line: &str) {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Copying blob ") {
            self.step = Step::Layers;
            self.retry = None;
            if rest.contains("skipped") {
                self.skipped += 1;
            } else if !rest.ends_with(" done") {
                self.layers += 1;
            }
        } else if line.starts_with("Copying config") {
            self.step = Step::Config;
        } else if line.starts_with("Writing manifest") || line.starts_with("Storing signatures") {
            self.step = Step::Storing;
        } else if let Some(retry) = retry_of(line) {
            self.step = Step::Connecting;
            self.retry = Some(retry);
        }
    }

    /// The phase to report: always starts `pulling image REF`, at most `MAX_PHASE_LEN` bytes.
    pub(super) fn phase(&self) -> String {
        let mut text = format!("pulling image {}", self.image);
        match self.step {
            Step::Connecting => {
                if let Some((count, why)) = &self.retry {
                    text.push_str(&format!(": retrying {count} after: {why}"));
                }
            }
            Step::Layers => {
                text.push_str(&format!(": copying layers ({})", self.layers));
                if self.skipped > 0 {
                    text.push_str(&format!(", {} already here", self.skipped));
                }
            }
            Step::Config => text.push_str(": copying the image's configuration"),
            Step::Storing => text.push_str(": storing the image"),
        }
        clip(text)
    }
}

/// Podman's retry warning: `... msg="Failed, retrying in 1s ... (1/3). Error: a: b: reason"`,
/// as `("(1/3)", "reason")`.
fn retry_of(line: &str) -> Option<(String, String)> {
    let at = line.find("retrying in ")?;
    let rest = &line[at..];
    let open = rest.find('(')?;
    let close = open + rest[open..].find(')')?;
    let count = rest[open..=close].to_owned();
    let reason = rest[close..]
        .rsplit(": ")
        .next()
        .unwrap_or_default()
        .trim_end_matches('"')
        .replace("\\\"", "\"");
    let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
    Some((count, reason.trim().to_owned()))
}

/// At most `MAX_PHASE_LEN` bytes, cut at a character boundary, no control characters.
pub(super) fn clip(text: String) -> String {
    let mut text: String = text.chars().filter(|c| !c.is_control()).collect();
    if text.len() > MAX_PHASE_LEN {
        let mut end = MAX_PHASE_LEN - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(lines: &[&str]) -> String {
        let mut p = PullProgress::new("nvcr.io/nvidia/pytorch:24.05-py3");
        for l in lines {
            p.line(l);
        }
        p.phase()
    }

    #[test]
    fn podman_output_becomes_a_short_phase() {
        let image = "nvcr.io/nvidia/pytorch:24.05-py3";
        assert_eq!(after(&[]), format!("pulling image {image}"));
        assert_eq!(
            after(&[
                "Trying to pull nvcr.io/nvidia/pytorch:24.05-py3...",
                "Getting image source signatures",
                "Copying blob sha256:aa11",
                "Copying blob sha256:bb22",
                "Copying blob sha256:cc33 skipped: already exists",
            ]),
            format!("pulling image {image}: copying layers (2), 1 already here")
        );
        assert_eq!(
            after(&["Copying blob sha256:aa11", "Copying config sha256:dd44"]),
            format!("pulling image {image}: copying the image's configuration")
        );
        assert_eq!(
            after(&[
                "Copying config sha256:dd44",
                "Writing manifest to image destination"
            ]),
            format!("pulling image {image}: storing the image")
        );
    }

    /// The warning podman 4.3 printed here for a registry that accepts and never answers.
    #[test]
    fn a_retry_says_which_and_why() {
        let line = r#"time="2026-12-06T02:40:07Z" level=warning msg="Failed, retrying in 1s ... (1/3). Error: initializing source docker://127.0.0.1:45871/x/y:1: pinging container registry 127.0.0.1:45871: Get \"https://127.0.0.1:45871/v2/\": net/http: TLS handshake timeout""#;
        assert_eq!(
            after(&["Trying to pull x...", line]),
            "pulling image nvcr.io/nvidia/pytorch:24.05-py3: retrying (1/3) after: TLS \
             handshake timeout"
        );
        assert_eq!(
            after(&[line, "Copying blob sha256:aa11"]),
            "pulling image nvcr.io/nvidia/pytorch:24.05-py3: copying layers (1)",
            "a retry that went through is forgotten"
        );
    }

    #[test]
    fn the_phase_is_clipped_and_printable() {
        let mut p = PullProgress::new(&format!("registry.example/{}:1", "é".repeat(300)));
        p.line("Copying blob sha256:aa11");
        let phase = p.phase();
        assert!(phase.len() <= MAX_PHASE_LEN, "{}", phase.len());
        assert!(phase.ends_with('…'));
        assert!(gpu_raft_store::validate::run_phase(&phase).is_ok());
        assert_eq!(clip("a\u{1b}[31mb\n".into()), "a[31mb");
    }
}
