//! The commands README.md and docs/ give, as a reader would copy them: every
//! `leader-gate …` line of a `sh`/`console` block is run by the real binary
//! (its flags and subcommands must parse), and every `scripts/…` it names
//! exists and is executable. The commands themselves need a cluster or a
//! sidecar; what is checked is that nothing a reader copies is refused as
//! usage.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The documents a reader copies commands from.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![Path::new(ROOT).join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The shell lines of the fenced `sh`, `bash` and `console` blocks, with
/// continuations joined and prompts and comments dropped.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut console = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            if in_block {
                in_block = false;
            } else {
                let lang = info.trim();
                in_block = matches!(lang, "sh" | "bash" | "console" | "shell");
                console = lang == "console";
            }
            continue;
        }
        if !in_block {
            continue;
        }
        let mut command = trimmed;
        if console {
            match command.strip_prefix("$ ") {
                Some(rest) => command = rest,
                None if pending.is_empty() => continue, // output
                None => {}
            }
        }
        let command = command.split(" #").next().unwrap_or("").trim_end();
        if command.starts_with('#') || command.is_empty() {
            continue;
        }
        if let Some(head) = command.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(command);
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// The `leader-gate` invocations of a shell line (after `&&`, `|`, `;`),
/// without their redirections (`> gated.yaml`, `< in.yaml`).
fn invocations(line: &str) -> Vec<Vec<String>> {
    line.split(['|', ';', '&'])
        .filter_map(|part| {
            let command = part.split(['>', '<']).next().unwrap_or("");
            let words = shell_words(command.trim());
            let at = words
                .iter()
                .position(|w| w == "leader-gate" || w.ends_with("/leader-gate"))?;
            (at == 0).then(|| words[1..].to_vec())
        })
        .collect()
}

/// Splits on blanks, honouring single and double quotes (enough for docs).
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut any = false;
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (_, c) => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    words
}

/// Runs `leader-gate ARGS` for at most a second, without a cluster or a
/// sidecar to reach; returns its stderr if it exited as a usage error.
fn refused_as_usage(args: &[String]) -> Option<String> {
    let dir = std::env::temp_dir().join(format!("readme-commands-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(args)
        .current_dir(&dir)
        .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        // Nothing listens here: gates wait for a sidecar, not refuse.
        .env("LEADER_GATE_URL", "http://127.0.0.1:9")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn leader-gate");
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            // 64 with clap's words: a flag or subcommand that does not
            // exist, or a value of the wrong form. (A SRC:DST whose
            // directory is not on this machine is the reader's to adapt.)
            let clap = [
                "unexpected argument",
                "unrecognized subcommand",
                "invalid value",
            ];
            let a_path_to_adapt =
                stderr.contains("invalid SRC:DST") && stderr.contains("does not exist");
            return (status.code() == Some(64)
                && clap.iter().any(|w| stderr.contains(w))
                && !a_path_to_adapt)
                .then_some(stderr);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_leader_gate_command_in_the_docs_parses_and_every_script_they_name_exists() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(ROOT).unwrap().display().to_string();
        for line in shell_lines(&text) {
            // A synopsis (`[--url URL]`, `ARGS...`) is read, not copied.
            let synopsis = line.contains("[--") || line.contains("...");
            for args in invocations(&line).into_iter().filter(|_| !synopsis) {
                checked += 1;
                if let Some(stderr) = refused_as_usage(&args) {
                    failures.push(format!("{name}: `{line}`: {}", stderr.trim()));
                }
            }
            for word in shell_words(&line) {
                if let Some(script) = word.strip_prefix("scripts/") {
                    use std::os::unix::fs::PermissionsExt;
                    let path = Path::new(ROOT).join("scripts").join(script);
                    let runnable = std::fs::metadata(&path)
                        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
                    let run_by_an_interpreter =
                        line.starts_with("bash ") || line.starts_with("sh ");
                    if !(path.is_file() && (runnable || run_by_an_interpreter)) {
                        failures.push(format!(
                            "{name}: `{line}`: scripts/{script} is not a runnable file"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked >= 10,
        "found only {checked} leader-gate commands: is the parser right?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_command_finder_reads_blocks_as_a_reader_copies_them() {
    let text = "```sh\n# a comment\nleader-gate exec --grace 3s -- metricbeat -e   # wrap\ncurl -sf x && leader-gate status\nleader-gate serve \\\n    --lease-name a\n```\n```console\n$ leader-gate watch --json\nsome output\n```\n```yaml\nargs: [leader-gate, nope]\n```\n";
    let lines = shell_lines(text);
    assert_eq!(
        lines,
        [
            "leader-gate exec --grace 3s -- metricbeat -e",
            "curl -sf x && leader-gate status",
            "leader-gate serve  --lease-name a",
            "leader-gate watch --json",
        ]
    );
    let all: Vec<Vec<String>> = lines.iter().flat_map(|l| invocations(l)).collect();
    assert_eq!(all.len(), 4);
    assert_eq!(all[1], ["status"]);
    // A flag that does not exist is refused, as a misprint in the docs would be.
    let bad: Vec<String> = ["serve", "--lease-nam", "x"].map(String::from).to_vec();
    assert!(refused_as_usage(&bad).is_some());
    let good: Vec<String> = ["status"].map(String::from).to_vec();
    assert!(refused_as_usage(&good).is_none());
}
