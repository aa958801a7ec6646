//! `gpuctl job submit train.sh`: a batch script as Slurm's `sbatch` takes it. The script's
//! `#SBATCH` and `#GPUMESH` lines (before its first command, as sbatch reads them) set the
//! submission's options; flags on the command line win. The job runs the script's text with the
//! interpreter of its `#!` line (`/bin/sh` without one), so the node needs no copy of the file.
//!
//! What each directive does is in `docs/batch-scripts.md`: honoured, ignored with a warning
//! (harmless where gpumesh does the thing anyway), or refused with its name.

use std::path::Path;

use crate::cli::SubmitArgs;

/// A script read for submission: the command that runs it, and the directives it carries.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Script {
    pub command: Vec<String>,
    pub directives: Vec<Directive>,
}

/// One option of a directive line: `--gpus=2` is `("gpus", Some("2"))`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Directive {
    /// `SBATCH` or `GPUMESH`, for messages.
    pub prefix: &'static str,
    pub name: String,
    pub value: Option<String>,
}

/// Read the script at `path`, to be run with `args`.
pub(crate) fn load(path: &Path, args: &[String]) -> Result<Script, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the batch script {}: {e}", path.display()))?;
    let name = path
        .file_name()
        .map_or_else(|| "script".into(), |n| n.to_string_lossy().into_owned());
    parse(&text, &name, args)
}

/// `text` as a script named `name` run with `args`.
pub(crate) fn parse(text: &str, name: &str, args: &[String]) -> Result<Script, String> {
    let mut lines = text.lines().peekable();
    let mut interpreter = vec!["/bin/sh".to_owned()];
    if let Some(shebang) = lines.peek().and_then(|l| l.strip_prefix("#!")) {
        let words: Vec<String> = shebang.split_whitespace().map(str::to_owned).collect();
        if words.is_empty() {
            return Err(format!("{name}: its #! line names no interpreter"));
        }
        interpreter = words;
        lines.next();
    }
    let mut directives = Vec::new();
    for line in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // Like sbatch: directives end at the first line that is not a comment.
        let Some(comment) = line.strip_prefix('#') else {
            break;
        };
        let (prefix, rest) = if let Some(rest) = comment.strip_prefix("SBATCH") {
            ("SBATCH", rest)
        } else if let Some(rest) = comment.strip_prefix("GPUMESH") {
            ("GPUMESH", rest)
        } else {
            continue;
        };
        if !rest.starts_with(char::is_whitespace) {
            continue;
        }
        directives.extend(options(prefix, &words(rest)?)?);
    }
    let mut command = interpreter;
    command.extend(["-c".to_owned(), text.to_owned(), name.to_owned()]);
    command.extend(args.iter().cloned());
    Ok(Script {
        command,
        directives,
    })
}

/// A directive line's words, as a shell splits them (quotes kept together, no expansion).
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            // A comment after the options ends the line.
            (None, '#') if word.is_none() => break,
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    if quote.is_some() {
        return Err(format!("unclosed quote in the directive {line:?}"));
    }
    out.extend(word);
    Ok(out)
}

/// Short options that take a value, by letter (sbatch's).
const SHORT: &[(char, &str)] = &[
    ('J', "job-name"),
    ('G', "gpus"),
    ('N', "nodes"),
    ('t', "time"),
    ('o', "output"),
    ('e', "error"),
    ('a', "array"),
    ('d', "dependency"),
    ('A', "account"),
    ('c', "cpus-per-task"),
    ('D', "chdir"),
    ('n', "ntasks"),
    ('p', "partition"),
    ('q', "qos"),
];

/// Short options that take no value, by letter.
const SHORT_FLAGS: &[(char, &str)] = &[('H', "hold")];

/// `--name=value`, `--name value`, `--flag`, `-X value`, `-Xvalue`.
fn options(prefix: &'static str, words: &[String]) -> Result<Vec<Directive>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = &words[i];
        i += 1;
        let takes_next = |i: usize| words.get(i).filter(|w| !w.starts_with('-')).cloned();
        let (name, value) = if let Some(long) = word.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None if is_flag(long) => (long.to_owned(), None),
                None => {
                    let value = takes_next(i);
                    i += usize::from(value.is_some());
                    (long.to_owned(), value)
                }
            }
        } else if let Some(long) = (word.strip_prefix('-'))
            .and_then(|short| SHORT_FLAGS.iter().find(|(c, _)| short == c.to_string()))
            .map(|(_, long)| *long)
        {
            (long.to_owned(), None)
        } else if let Some(short) = word.strip_prefix('-') {
            let mut chars = short.chars();
            let letter = chars.next().ok_or_else(|| format!("#{prefix} {word:?}"))?;
            let long = SHORT
                .iter()
                .find(|(c, _)| *c == letter)
                .map(|(_, l)| (*l).to_owned())
                .ok_or_else(|| {
                    format!("#{prefix} -{letter}: not supported (see docs/batch-scripts.md)")
                })?;
            let attached = chars.as_str();
            let value = if attached.is_empty() {
                let value = takes_next(i);
                i += usize::from(value.is_some());
                value
            } else {
                Some(attached.trim_start_matches('=').to_owned())
            };
            (long, value)
        } else {
            return Err(format!(
                "#{prefix} {word:?}: expected an option like --gpus=2"
            ));
        };
        out.push(Directive {
            prefix,
            name,
            value,
        });
    }
    Ok(out)
}

/// Options that take no value.
fn is_flag(name: &str) -> bool {
    matches!(
        name,
        "exclusive" | "requeue" | "no-requeue" | "singleton" | "hold" | "wait" | "parsable"
    )
}

/// Set what the directives say on `args`, where the command line said nothing; the warnings
/// for directives ignored.
pub(crate) fn apply(
    directives: &[Directive],
    args: &mut SubmitArgs,
) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    for d in directives {
        let shown = match &d.value {
            Some(v) => format!("#{} --{}={v}", d.prefix, d.name),
            None => format!("#{} --{}", d.prefix, d.name),
        };
        let value = || {
            d.value
                .clone()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{shown}: needs a value"))
        };
        let bad = |why: String| format!("{shown}: {why}");
        match d.name.as_str() {
            "job-name" | "name" => set(&mut args.name, value()?),
            "account" | "tenant" => set(&mut args.tenant, value()?),
            name @ ("gpus" | "gres" | "gpus-per-node") => {
                let text = value()?;
                let gpus = match name {
                    "gres" => text.strip_prefix("gpu:").ok_or_else(|| {
                        bad("only gpu:N or gpu:TYPE:N resources exist here".into())
                    })?,
                    _ => text.as_str(),
                };
                let (gpu_type, count) = gpu_count(gpus).map_err(bad)?;
                // `--gpus` counts them in all; Slurm's `--gres` and `--gpus-per-node` per node.
                if args.gpus == 0 && args.gpus_per_node.is_none() {
                    match name {
                        "gpus" => args.gpus = count,
                        _ => args.gpus_per_node = Some(count),
                    }
                }
                if let Some(t) = gpu_type.filter(|_| args.gpu_types.is_empty()) {
                    args.gpu_types.push(t);
                }
            }
            "gpu-type" => {
                if args.gpu_types.is_empty() {
                    args.gpu_types = value()?.split(',').map(str::to_owned).collect();
                }
            }
            "nodes" => {
                let n: u32 = value()?
                    .parse()
                    .map_err(|_| bad("a node count (ranges like 2-4 are not supported)".into()))?;
                if args.nodes == 1 {
                    args.nodes = n;
                }
            }
            "time" | "time-limit" | "wall-time" => {
                let seconds = match d.prefix {
                    "SBATCH" => slurm_time(&value()?).map_err(bad)?,
                    _ => crate::units::time_limit(&value()?).map_err(bad)?,
                };
                set(&mut args.wall_time, seconds);
            }
            "estimate" => set(
                &mut args.estimate,
                crate::units::whole_seconds(&value()?).map_err(bad)?,
            ),
            "mem" | "memory" => set(
                &mut args.memory,
                crate::units::size_mib(&value()?).map_err(bad)?,
            ),
            "cpus-per-task" => {
                let cores: u32 = value()?
                    .parse()
                    .map_err(|_| bad("a whole number of CPUs".into()))?;
                set(&mut args.cpus, cores.saturating_mul(1000));
            }
            "chdir" | "workdir" => set(&mut args.workdir, value()?),
            "selector" | "env" => {
                let pair = crate::args::key_value(&value()?).map_err(bad)?;
                let list = if d.name == "env" {
                    &mut args.env
                } else {
                    &mut args.selectors
                };
                if !list.iter().any(|(k, _)| *k == pair.0) {
                    list.push(pair);
                }
            }
            "image" => set(&mut args.image, value()?),
            "array" => set(&mut args.array, value()?),
            "topology" => set(&mut args.topology, value()?),
            // Slurm's tree topology: all of the job under one leaf switch, a network block.
            "switches" => {
                let text = value()?;
                if text.split('@').next() != Some("1") {
                    return Err(bad(
                        "only 1 is honoured (the gang inside one network block)".into(),
                    ));
                }
                set(&mut args.topology, "block".to_owned());
            }
            "dependency" => dependency(&value()?, args).map_err(bad)?,
            "after" => args.after.push(value()?),
            "singleton" => args.singleton = true,
            "hold" => args.hold = true,
            "priority" => set(
                &mut args.priority,
                value()?.parse().map_err(|_| bad("a number".into()))?,
            ),
            "max-attempts" => set(
                &mut args.max_attempts,
                value()?.parse().map_err(|_| bad("a number".into()))?,
            ),
            "ntasks" | "ntasks-per-node" => {
                if value()? != "1" {
                    return Err(bad(
                        "gpumesh starts one process per node (start more from the script)"
                            .into(),
                    ));
                }
            }
            "output" | "error" | "open-mode" => warnings.push(format!(
                "{shown} ignored: the job's output is kept on its node; read it with `gpuctl job logs`"
            )),
            "notify" => set(&mut args.notify, value()?),
            "mail-type" => {
                let (events, unknown) = mail_events(&value()?);
                if !unknown.is_empty() {
                    warnings.push(format!("{shown}: {} ignored", unknown.join(",")));
                }
                if args.notify_on.is_empty() {
                    args.notify_on = events;
                }
            }
            "mail-user" => warnings.push(format!(
                "{shown} ignored: gpumesh posts to webhooks, not mail (--notify URL)"
            )),
            "export" => warnings.push(format!(
                "{shown} ignored: the job gets only the environment given with --env"
            )),
            "exclusive" | "requeue" | "no-requeue" | "qos" | "comment" | "signal" | "wait"
            | "parsable" | "kill-on-invalid-dep" => {
                warnings.push(format!("{shown} ignored: it changes nothing here"));
            }
            "partition" => {
                return Err(bad(
                    "gpumesh has no partitions: select nodes with --selector KEY=VALUE".into(),
                ));
            }
            _ => return Err(bad("not supported (see docs/batch-scripts.md)".into())),
        }
    }
    if !args.notify_on.is_empty() && args.notify.is_none() {
        warnings.push(
            "--mail-type: no --notify URL for this job; its tenant's webhook (if any) hears every event"
                .into(),
        );
        args.notify_on.clear();
    }
    Ok(warnings)
}

/// Slurm's mail types as webhook events (BEGIN, END, FAIL, REQUEUE, ALL, NONE), and the types
/// with no event.
fn mail_events(types: &str) -> (Vec<String>, Vec<String>) {
    let mut events = Vec::new();
    let mut unknown = Vec::new();
    for t in types.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let add: &[&str] = match t.to_ascii_uppercase().as_str() {
            "BEGIN" => &["start"],
            "END" => &["end", "failure"],
            "FAIL" => &["failure"],
            "REQUEUE" => &["requeue"],
            "ALL" => &["start", "end", "failure", "requeue"],
            "NONE" => &[],
            _ => {
                unknown.push(t.to_owned());
                &[]
            }
        };
        for e in add {
            if !events.iter().any(|have| have == e) {
                events.push((*e).to_owned());
            }
        }
    }
    (events, unknown)
}

/// Set `field` unless the command line did.
fn set<T>(field: &mut Option<T>, value: T) {
    if field.is_none() {
        *field = Some(value);
    }
}

/// `2` or `a100:2` (Slurm's `--gpus`): the type, if named, and the count.
fn gpu_count(text: &str) -> Result<(Option<String>, u32), String> {
    let (gpu_type, count) = match text.rsplit_once(':') {
        Some((t, n)) => (Some(t.to_owned()), n),
        None => (None, text),
    };
    let count = count
        .parse()
        .map_err(|_| format!("{count:?} is not a GPU count"))?;
    Ok((gpu_type, count))
}

/// Slurm's `--dependency`: `afterok:1:2,afterany:3`, `singleton`; `?` (any of) is not
/// supported.
fn dependency(text: &str, args: &mut SubmitArgs) -> Result<(), String> {
    if text.contains('?') {
        return Err("`?` (any one of) is not supported: every dependency must be met".into());
    }
    let mut rest = Vec::new();
    for part in text.split(',') {
        match part.trim() {
            "singleton" => args.singleton = true,
            "" => {}
            other => rest.push(other.to_owned()),
        }
    }
    if !rest.is_empty() {
        args.after.push(rest.join(","));
    }
    Ok(())
}

/// Slurm's `--time`: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`, in seconds.
fn slurm_time(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS)");
    let number = |s: &str| s.parse::<u64>().map_err(|_| bad());
    let (days, clock) = match text.split_once('-') {
        Some((d, c)) => (number(d)?, c),
        None => (0, text),
    };
    let parts: Vec<u64> = clock.split(':').map(number).collect::<Result<_, _>>()?;
    let (h, m, s) = match (text.contains('-'), parts.as_slice()) {
        (false, [m]) => (0, *m, 0),
        (false, [m, s]) => (0, *m, *s),
        (_, [h, m, s]) => (*h, *m, *s),
        (true, [h]) => (*h, 0, 0),
        (true, [h, m]) => (*h, *m, 0),
        _ => return Err(bad()),
    };
    Ok(((days * 24 + h) * 60 + m) * 60 + s)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, JobVerb, Noun};

    const TRAIN: &str = "#!/bin/bash\n\
        #SBATCH --job-name=train-resnet\n\
        #SBATCH --gres=gpu:a100:2 --nodes=1\n\
        #SBATCH -t 1-02:30:00   # a day and a half\n\
        #SBATCH --mem=32G -c 8\n\
        #SBATCH --output=train-%j.out\n\
        #SBATCH --array=0-3%2\n\
        #SBATCH --dependency=afterok:12:13,singleton\n\
        #SBATCH -H\n\
        #GPUMESH --selector rack=r7\n\
        \n\
        echo start\n\
        #SBATCH --gpus=8\n";

    fn submit_args(flags: &[&str]) -> SubmitArgs {
        let argv = [&["gpuctl", "job", "submit"][..], flags].concat();
        match Cli::parse_from(argv).command {
            Noun::Job(JobVerb::Submit(args)) => *args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn directives_become_the_submission_and_the_command_line_wins() {
        let script = parse(TRAIN, "train.sh", &["--lr".into(), "0.1".into()]).expect("parses");
        assert_eq!(
            script.command[..2],
            ["/bin/bash".to_owned(), "-c".to_owned()]
        );
        assert_eq!(script.command[2], TRAIN);
        assert_eq!(script.command[3..], ["train.sh", "--lr", "0.1"]);
        let mut args = submit_args(&["train.sh", "--name", "mine"]);
        let warnings = apply(&script.directives, &mut args).expect("applies");
        assert_eq!(args.name.as_deref(), Some("mine"), "the flag wins");
        assert_eq!(args.gpus_per_node, Some(2));
        assert_eq!(args.gpu_types, ["a100"]);
        assert_eq!(args.wall_time, Some(((24 + 2) * 60 + 30) * 60));
        assert_eq!((args.memory, args.cpus), (Some(32 * 1024), Some(8000)));
        assert_eq!(args.array.as_deref(), Some("0-3%2"));
        assert_eq!(args.after, ["afterok:12:13"]);
        assert!(args.singleton && args.hold);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("--output=train-%j.out ignored"));
        // A directive after the first command is not one (sbatch stops there too).
        assert_eq!(args.gpus, 0);
    }

    #[test]
    fn mail_types_become_the_events_of_the_jobs_webhook() {
        let text = "#!/bin/sh\n#SBATCH --mail-type=BEGIN,FAIL,TIME_LIMIT\n#GPUMESH --notify https://h/x\ntrue\n";
        let script = parse(text, "s.sh", &[]).expect("parses");
        let mut args = submit_args(&["s.sh"]);
        let warnings = apply(&script.directives, &mut args).expect("applies");
        assert_eq!(args.notify.as_deref(), Some("https://h/x"));
        assert_eq!(args.notify_on, ["start", "failure"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("TIME_LIMIT ignored"), "{warnings:?}");
        let no_url =
            parse("#!/bin/sh\n#SBATCH --mail-type=ALL\ntrue\n", "s.sh", &[]).expect("parses");
        let mut args = submit_args(&["s.sh"]);
        let warnings = apply(&no_url.directives, &mut args).expect("applies");
        assert!(args.notify_on.is_empty() && warnings[0].contains("no --notify URL"));
    }

    #[test]
    fn unknown_and_unsupported_directives_are_refused_by_name() {
        for (line, says) in [
            ("#SBATCH --frobnicate=1", "--frobnicate=1: not supported"),
            ("#SBATCH -p gpu", "no partitions"),
            ("#SBATCH --ntasks=4", "one process per node"),
            ("#SBATCH --dependency=afterok:1?afterok:2", "not supported"),
            ("#SBATCH --gres=mps:50", "only gpu:N"),
            ("#SBATCH --time=1:2:3:4", "not a time"),
            ("#SBATCH -x n3", "-x: not supported"),
            ("#SBATCH --job-name='unclosed", "unclosed quote"),
            ("#SBATCH --switches=2", "only 1 is honoured"),
        ] {
            let text = format!("#!/bin/sh\n{line}\ntrue\n");
            let err = parse(&text, "s.sh", &[])
                .and_then(|s| apply(&s.directives, &mut submit_args(&["s.sh"])))
                .expect_err(line);
            assert!(err.contains(says), "{line}: {err}");
        }
    }

    #[test]
    fn one_switch_keeps_a_gang_in_one_network_block() {
        for text in ["#SBATCH --switches=1@2:00:00", "#GPUMESH --topology block"] {
            let text = format!("#!/bin/sh\n#SBATCH --nodes=2\n{text}\ntrue\n");
            let script = parse(&text, "s.sh", &[]).expect("parses");
            let mut args = submit_args(&["s.sh"]);
            apply(&script.directives, &mut args).expect("applies");
            assert_eq!(args.topology.as_deref(), Some("block"), "{text}");
        }
    }

    #[test]
    fn slurm_times() {
        for (text, seconds) in [
            ("30", 1800),
            ("30:15", 1815),
            ("2:00:00", 7200),
            ("1-0", 86_400),
            ("1-2:30", 95_400),
            ("0-0:0:5", 5),
        ] {
            assert_eq!(slurm_time(text), Ok(seconds), "{text}");
        }
    }
}
