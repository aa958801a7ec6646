//! `ListJobs`' answers: a page of the state's jobs (an array folded into one line when asked),
//! and the folding of finished jobs' views.

use std::collections::HashMap;

use gpu_proto::v1 as pb;
use gpu_raft_store::{ClusterState, Job, JobId, JobState};

/// Jobs (lines) per `ListJobs` answer unless the request asks for fewer, and at most.
pub(super) const DEFAULT_PAGE: usize = 1_000;
pub(super) const MAX_PAGE: usize = 5_000;

/// One page of the state's `wanted` jobs with ids above `after`: at most `limit` views, an
/// array folded into one line (its first task's view, with every wanted task of it counted by
/// state) when `fold`; and the `after_id` of the next page, if one may follow.
pub(super) fn page_of(
    state: &ClusterState,
    after: JobId,
    limit: usize,
    fold: bool,
    wanted: &impl Fn(&Job) -> bool,
    view: impl Fn(&Job) -> pb::Job,
) -> (Vec<pb::Job>, Option<JobId>) {
    let mut lines = Vec::new();
    // The array of the last line: its tasks follow it, consecutive ids.
    let mut last_array = None;
    for j in state.jobs.range(after.saturating_add(1)..).map(|(_, j)| j) {
        let array = j.array_task.map(|t| t.array).filter(|_| fold);
        // An array's line stands for all its tasks: it was made at its first wanted task.
        if array.is_some_and(|a| a <= after || last_array == Some(a)) {
            continue;
        }
        if !wanted(j) {
            continue;
        }
        if lines.len() == limit {
            return (lines, Some(j.id - 1));
        }
        let mut line = view(j);
        if let Some(a) = array {
            for task in state.array_tasks(a).filter(|t| wanted(t)) {
                count_task(&mut line, task.state);
            }
        }
        last_array = array;
        lines.push(line);
    }
    (lines, None)
}

/// `page_of` from the newest job down: at most `limit` views of the wanted jobs with ids below
/// `before` (every id when 0), newest first, an array folded into one line where its newest
/// wanted task stands (the line is the view of its first wanted task, with its wanted tasks
/// counted, as `page_of` makes it); and the `before` of the next page, if one may follow.
pub(super) fn page_newest_first(
    state: &ClusterState,
    before: JobId,
    limit: usize,
    fold: bool,
    wanted: &impl Fn(&Job) -> bool,
    view: impl Fn(&Job) -> pb::Job,
) -> (Vec<pb::Job>, Option<JobId>) {
    let upper = if before == 0 { JobId::MAX } else { before };
    let mut lines = Vec::new();
    // An array's tasks are consecutive ids: its line is made at the first met, the rest skipped.
    let mut last_array = None;
    for j in state.jobs.range(..upper).rev().map(|(_, j)| j) {
        let array = j.array_task.map(|t| t.array).filter(|_| fold);
        if array.is_some() && array == last_array {
            continue;
        }
        if !wanted(j) {
            continue;
        }
        if lines.len() == limit {
            return (lines, Some(j.id + 1));
        }
        let line = match array {
            Some(a) => {
                let tasks: Vec<&Job> = state.array_tasks(a).filter(|t| wanted(t)).collect();
                let mut line = view(tasks.first().copied().unwrap_or(j));
                for task in tasks {
                    count_task(&mut line, task.state);
                }
                line
            }
            None => view(j),
        };
        last_array = array;
        lines.push(line);
    }
    (lines, None)
}

/// At most `limit` lines of `items` folded by array: one line per array (the view of its
/// first item, with its items counted by state name) and one per item outside arrays.
pub(super) fn fold<T>(
    items: impl Iterator<Item = T>,
    limit: usize,
    array_and_state: impl Fn(&T) -> (Option<JobId>, Option<JobState>),
    view: impl Fn(T) -> pb::Job,
) -> Vec<pb::Job> {
    let mut lines: Vec<pb::Job> = Vec::new();
    let mut line_of: HashMap<JobId, usize> = HashMap::new();
    for item in items {
        let (array, state) = array_and_state(&item);
        let line = match array.map(|a| (a, line_of.get(&a))) {
            Some((_, Some(&line))) => line,
            _ if lines.len() == limit => continue,
            found => {
                lines.push(view(item));
                if let Some((a, _)) = found {
                    line_of.insert(a, lines.len() - 1);
                }
                lines.len() - 1
            }
        };
        if let (Some(_), Some(state)) = (array, state) {
            count_task(&mut lines[line], state);
        }
    }
    lines
}

/// Count a task in `state` on its array's folded line.
fn count_task(line: &mut pb::Job, state: JobState) {
    let name = state.to_string().to_lowercase();
    *line.array_task_states.entry(name).or_default() += 1;
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{Command, JobSpec, LogEntry};

    use super::*;

    fn submit(s: &mut ClusterState, name: &str, array: Option<&str>) {
        let spec = JobSpec {
            name: name.into(),
            command: vec!["true".into()],
            array: array.map(|a| a.parse().expect("an array")),
            ..JobSpec::default()
        };
        s.apply(&LogEntry {
            proposed_at_ms: 1,
            cmd: Command::submit(spec),
            meta: None,
            request: None,
        });
    }

    /// j-1, the array j-2..j-6, j-7.
    fn state() -> ClusterState {
        let mut s = ClusterState::new();
        submit(&mut s, "one", None);
        submit(&mut s, "sweep", Some("0-4"));
        submit(&mut s, "seven", None);
        s
    }

    fn view(j: &Job) -> pb::Job {
        pb::Job {
            id: j.id,
            ..pb::Job::default()
        }
    }

    fn ids(lines: &[pb::Job]) -> Vec<u64> {
        lines.iter().map(|l| l.id).collect()
    }

    #[test]
    fn newest_first_pages_go_down_and_fold_an_array_where_it_stands() {
        let s = state();
        let all = |_: &Job| true;
        let (first, next) = page_newest_first(&s, 0, 2, true, &all, view);
        assert_eq!(
            (ids(&first), next),
            (vec![7, 2], Some(2)),
            "j-7, then the array at j-2"
        );
        assert_eq!(first[1].array_task_states.get("pending"), Some(&5));
        let (one, next) = page_newest_first(&s, 0, 1, true, &all, view);
        assert_eq!((ids(&one), next), (vec![7], Some(7)));
        let (two, next) = page_newest_first(&s, 7, 1, true, &all, view);
        assert_eq!(
            (ids(&two), next),
            (vec![2], Some(2)),
            "the array whole, then below it"
        );
        let (three, next) = page_newest_first(&s, 2, 1, true, &all, view);
        assert_eq!((ids(&three), next), (vec![1], None));
        // Unfolded, tasks are jobs; only wanted tasks are counted on a folded line.
        let (tasks, next) = page_newest_first(&s, 0, 3, false, &all, view);
        assert_eq!((ids(&tasks), next), (vec![7, 6, 5], Some(5)));
        let odd = |j: &Job| j.id % 2 == 1;
        let (lines, _) = page_newest_first(&s, 0, 10, true, &odd, view);
        assert_eq!(ids(&lines), [7, 3, 1]);
        assert_eq!(lines[1].array_task_states.get("pending"), Some(&2));
    }

    #[test]
    fn pages_fold_an_array_whole_and_resume_after_it() {
        let s = state();
        let all = |_: &Job| true;
        let (first, next) = page_of(&s, 0, 2, true, &all, view);
        assert_eq!((ids(&first), next), (vec![1, 2], Some(6)));
        assert_eq!(first[1].array_task_states.get("pending"), Some(&5));
        let (second, next) = page_of(&s, 6, 2, true, &all, view);
        assert_eq!((ids(&second), next), (vec![7], None));

        // Unfolded, the tasks are jobs like any other.
        let (tasks, next) = page_of(&s, 0, 3, false, &all, view);
        assert_eq!((ids(&tasks), next), (vec![1, 2, 3], Some(3)));
        // A page that starts inside an array does not make a second line for it.
        let (inside, _) = page_of(&s, 3, 10, true, &all, view);
        assert_eq!(ids(&inside), [7]);
        // Only wanted tasks are counted.
        let odd = |j: &Job| j.id % 2 == 1;
        let (lines, _) = page_of(&s, 0, 10, true, &odd, view);
        assert_eq!(ids(&lines), [1, 3, 7]);
        assert_eq!(lines[1].array_task_states.get("pending"), Some(&2));
    }
}
