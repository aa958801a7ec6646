//! Shell-style globs, as `ListJobsRequest.name` defines them: the agent filters by one, and
//! gpuctl checks the answer again (an agent from before the filter ignores it).

/// Whether `text` matches the shell-style `glob` (`*` any run, `?` any one character).
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let (g, t): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    // The classic two-pointer match with backtracking to the last star.
    let (mut gi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match g.get(gi) {
            Some('*') => {
                star = Some((gi, ti));
                gi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                gi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sg, st)) => {
                    gi = sg + 1;
                    ti = st + 1;
                    star = Some((sg, st + 1));
                }
                None => return false,
            },
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs_match_like_a_shell() {
        for (glob, text, want) in [
            ("sweep-*", "sweep-12", true),
            ("sweep-*", "sweep-", true),
            ("sweep-*", "swee", false),
            ("*", "", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*-lr-*-b?", "train-lr-0.1-b8", true),
            ("*-lr-*-b?", "train-lr-0.1-b16", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("**a", "bba", true),
        ] {
            assert_eq!(glob_matches(glob, text), want, "{glob} vs {text}");
        }
    }
}
