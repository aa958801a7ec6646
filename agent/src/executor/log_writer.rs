//! The supervisor's log writer: the job's stdout and stderr arrive through pipes and are written
//! to the run's `stdout.log` / `stderr.log`, each rotated at `jobs.log_max` (the layout and the
//! meaning of offsets are in `log_files.rs`).
//!
//! Each stream has a reader thread and a writer thread joined by a bounded queue. The reader
//! always drains the pipe: when the writer falls behind (a slow disk) and the queue is full, the
//! output is dropped and counted, so a job never blocks on its own logging. The writer never
//! gives up: output it cannot write (ENOSPC) is dropped and counted, and one notice saying how
//! much was lost is written once writing works again (or when the run ends), in stderr.log:
//! stdout.log holds only what the job wrote. The supervisor's own notices go into the stderr
//! queue too (`Notes`), so they are rotated and capped like the job's output.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, PipeReader, PipeWriter, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::log_files::{self, BaseRecord};

/// How much one pipe read takes, and so the largest queued chunk.
const CHUNK: usize = 64 * 1024;
/// Up to this much output per stream waits for a slow disk before any is dropped.
const QUEUE_BYTES: usize = 4 << 20;
/// After the job has ended, how long its output may take to drain (a process it left behind
/// may hold the pipe open; what it writes later is not kept).
const DRAIN: Duration = Duration::from_secs(2);
/// At most one notice of lost output per stream this often (and one at the end).
const NOTICE_EVERY: Duration = Duration::from_secs(10);

/// What the rotation rule says to do next with `pending` bytes for a file holding `len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Write this many bytes to the current file.
    Write(usize),
    /// The current file is full: rotate first.
    Rotate,
}

/// Pure: a file is filled exactly to `cap`, then rotated before the next byte.
pub(crate) fn step(len: u64, cap: u64, pending: usize) -> Step {
    if len >= cap {
        Step::Rotate
    } else {
        let room = usize::try_from(cap - len).unwrap_or(usize::MAX);
        Step::Write(pending.min(room))
    }
}

/// One stream's files, as its writer keeps them.
pub(crate) struct LogFile {
    path: PathBuf,
    file: File,
    /// Bytes in the current file.
    len: u64,
    /// Stream offset of the current file's first byte.
    base: u64,
    cap: u64,
    /// Output dropped since writing last worked, and why.
    lost: Option<Lost>,
    /// Where the notice of lost output goes: stderr's queue for stdout (stdout.log holds only
    /// what the job wrote), the file itself for stderr.
    notices: Option<Queue>,
    noticed_at: Option<Instant>,
}

struct Lost {
    bytes: u64,
    why: String,
}

impl LogFile {
    /// Open (or create) the stream whose current file is `path`.
    pub(crate) fn open(path: &Path, cap: u64) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let meta = file.metadata()?;
        let base = std::fs::read_to_string(log_files::base_record(path))
            .ok()
            .and_then(|t| BaseRecord::parse(&t))
            .filter(|r| r.ino == meta.ino())
            .map_or(0, |r| r.base);
        Ok(Self {
            path: path.to_owned(),
            file,
            len: meta.len(),
            base,
            cap,
            lost: None,
            notices: None,
            noticed_at: None,
        })
    }

    /// Send the notices of lost output to another stream's queue.
    fn notices_to(mut self, queue: Queue) -> Self {
        self.notices = Some(queue);
        self
    }

    /// Append `data`; what cannot be written is counted, and said once writing works again.
    pub(crate) fn write(&mut self, data: &[u8]) {
        if let Err((unwritten, e)) = self.append(data) {
            self.drop_output(unwritten, Some(&e));
            return;
        }
        self.say_lost(false);
    }

    /// Say how much output was lost since the last notice: at most every `NOTICE_EVERY` (a
    /// writer that keeps falling behind would otherwise say it every few chunks), and at the
    /// end (`last`).
    fn say_lost(&mut self, last: bool) {
        let Some(lost) = &self.lost else { return };
        if !last && self.noticed_at.is_some_and(|t| t.elapsed() < NOTICE_EVERY) {
            return;
        }
        let stream = self
            .path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let notice = format!(
            "\ngpumesh: {} bytes of {stream} were not kept: {}\n",
            lost.bytes, lost.why
        );
        match &self.notices {
            Some(queue) => queue.push(notice.as_bytes()),
            None => {
                if self.append(notice.as_bytes()).is_err() {
                    return;
                }
            }
        }
        self.lost = None;
        self.noticed_at = Some(Instant::now());
    }

    /// Output dropped before it reached the writer (`why`), said with the next write.
    pub(crate) fn dropped(&mut self, bytes: u64, why: &str) {
        match &mut self.lost {
            Some(lost) => lost.bytes += bytes,
            None => {
                self.lost = Some(Lost {
                    bytes,
                    why: why.to_owned(),
                });
            }
        }
    }

    fn drop_output(&mut self, bytes: usize, error: Option<&std::io::Error>) {
        let why = error.map_or_else(
            || "the log could not be written".to_owned(),
            |e| format!("the log could not be written ({e})"),
        );
        self.dropped(bytes as u64, &why);
    }

    /// Write all of `data`, rotating at the cap. On an error, how much was not written.
    fn append(&mut self, mut data: &[u8]) -> Result<(), (usize, std::io::Error)> {
        while !data.is_empty() {
            match step(self.len, self.cap, data.len()) {
                Step::Rotate => self.rotate().map_err(|e| (data.len(), e))?,
                Step::Write(n) => match self.file.write(&data[..n]) {
                    Ok(0) => return Err((data.len(), ErrorKind::WriteZero.into())),
                    Ok(written) => {
                        self.len += written as u64;
                        data = &data[written..];
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err((data.len(), e)),
                },
            }
        }
        Ok(())
    }

    /// Start a new current file; the full one becomes `.1`, replacing the one before. The
    /// order is the one readers rely on (see `log_files.rs`). Nothing is renamed unless the new
    /// file and its record could be written.
    fn rotate(&mut self) -> std::io::Result<()> {
        let next = log_files::next(&self.path);
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&next)?;
        let base = self.base + self.len;
        let record = BaseRecord {
            ino: file.metadata()?.ino(),
            base,
        };
        let written = write_record(&self.path, record)
            .and_then(|()| std::fs::rename(&self.path, log_files::rotated(&self.path)))
            .and_then(|()| std::fs::rename(&next, &self.path));
        if let Err(e) = written {
            std::fs::remove_file(&next).ok();
            return Err(e);
        }
        self.file = file;
        self.base = base;
        self.len = 0;
        Ok(())
    }
}

/// Replace `<current>.base` in one step (a reader sees the old record or the new).
fn write_record(current: &Path, record: BaseRecord) -> std::io::Result<()> {
    let path = log_files::base_record(current);
    let tmp = log_files::next(&path);
    std::fs::write(&tmp, record.encode())?;
    std::fs::rename(&tmp, &path)
}

/// Output waiting for a stream's writer, bounded in bytes: many small writes (a job printing
/// line by line) take little room and are written together.
#[derive(Clone)]
struct Queue(Arc<(Mutex<Pending>, Condvar)>);

#[derive(Default)]
struct Pending {
    data: Vec<u8>,
    /// Bytes of the job's output refused because `data` was full.
    dropped: u64,
    /// Nothing more will come.
    closed: bool,
}

impl Queue {
    fn new() -> Self {
        Self(Arc::new((Mutex::new(Pending::default()), Condvar::new())))
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.0.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The job's output: kept if there is room, otherwise counted as dropped. Never waits.
    fn offer(&self, bytes: &[u8]) {
        let mut p = self.pending();
        if p.data.len() + bytes.len() <= QUEUE_BYTES {
            p.data.extend_from_slice(bytes);
        } else {
            p.dropped += bytes.len() as u64;
        }
        self.0.1.notify_one();
    }

    /// The supervisor's notices: always kept (they are few and short).
    fn push(&self, bytes: &[u8]) {
        self.pending().data.extend_from_slice(bytes);
        self.0.1.notify_one();
    }

    fn close(&self) {
        self.pending().closed = true;
        self.0.1.notify_one();
    }

    /// Wait for output: what is queued and how much was dropped since, or `None` once closed
    /// and empty.
    fn take(&self) -> Option<(Vec<u8>, u64)> {
        let mut p = self.pending();
        loop {
            if !p.data.is_empty() || p.dropped > 0 {
                let taken = (std::mem::take(&mut p.data), p.dropped);
                p.dropped = 0;
                return Some(taken);
            }
            if p.closed {
                return None;
            }
            p = self.0.1.wait(p).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// One stream: its pipe's reader thread, its file's writer thread, and the queue between.
struct Stream {
    reader: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    queue: Queue,
}

impl Stream {
    fn start(name: &str, file: LogFile, queue: Queue) -> std::io::Result<(Self, PipeWriter)> {
        let (pipe_out, pipe_in) = std::io::pipe()?;
        let rx = queue.clone();
        let writer = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || write_queue(file, &rx))?;
        let tx = queue.clone();
        let reader = std::thread::Builder::new()
            .name(format!("{name}-reader"))
            .spawn(move || drain_pipe(pipe_out, &tx))?;
        Ok((
            Self {
                reader: Some(reader),
                writer: Some(writer),
                queue,
            },
            pipe_in,
        ))
    }

    /// Wait (until `deadline`) for the job's output to end, then for the writer to write all
    /// that was queued.
    fn finish(&mut self, deadline: Instant) {
        if let Some(reader) = self.reader.take() {
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if reader.is_finished() {
                reader.join().ok();
            }
            // Otherwise it is left blocked on a pipe that something else holds open; it ends
            // with the process.
        }
        self.queue.close();
        if let Some(writer) = self.writer.take() {
            writer.join().ok();
        }
    }
}

/// The writer thread: write what arrives until the queue is closed and empty.
fn write_queue(mut file: LogFile, queue: &Queue) {
    while let Some((data, dropped)) = queue.take() {
        file.write(&data);
        if dropped > 0 {
            file.dropped(dropped, "the log writer could not keep up");
        }
    }
    // Say what was lost at the very end too, if it can be written now.
    file.say_lost(true);
}

/// The reader thread: read the pipe until every writer of it has closed it, never waiting for
/// the file writer.
fn drain_pipe(mut pipe: PipeReader, queue: &Queue) {
    let mut buf = vec![0; CHUNK];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => queue.offer(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The write ends of the job's stdout and stderr pipes, for its `Command`. They must be closed
/// in the supervisor once the job has them (drop the `Command`), or the readers never see the
/// end of the output.
pub(crate) struct Pipes {
    pub stdout: PipeWriter,
    pub stderr: PipeWriter,
}

/// A run's two log streams. Dropping it finishes them: it waits (at most `DRAIN`) for the job's
/// output to end, then for everything queued to be written.
pub(crate) struct JobLogs {
    stdout: Stream,
    stderr: Stream,
}

impl JobLogs {
    /// Open `stdout` and `stderr` (the current files' paths) and start their threads.
    pub(crate) fn start(stdout: &Path, stderr: &Path, cap: u64) -> std::io::Result<(Self, Pipes)> {
        let (out_file, err_file) = (LogFile::open(stdout, cap)?, LogFile::open(stderr, cap)?);
        let err_queue = Queue::new();
        let out_file = out_file.notices_to(err_queue.clone());
        let (err, err_pipe) = Stream::start("stderr", err_file, err_queue)?;
        let (out, out_pipe) = Stream::start("stdout", out_file, Queue::new())?;
        Ok((
            Self {
                stdout: out,
                stderr: err,
            },
            Pipes {
                stdout: out_pipe,
                stderr: err_pipe,
            },
        ))
    }

    /// A writer into stderr.log for the supervisor's own notices.
    pub(crate) fn notes(&self) -> Notes {
        Notes(self.stderr.queue.clone())
    }
}

impl Drop for JobLogs {
    fn drop(&mut self) {
        let deadline = Instant::now() + DRAIN;
        // stdout first: its writer may still queue a notice into stderr.
        self.stdout.finish(deadline);
        self.stderr.finish(deadline);
    }
}

/// The supervisor's notices, written into stderr.log in order with the job's output.
pub(crate) struct Notes(Queue);

impl Write for Notes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::log_files::read_at;

    #[test]
    fn a_file_fills_to_the_cap_then_rotates() {
        assert_eq!(step(0, 10, 4), Step::Write(4));
        assert_eq!(step(8, 10, 4), Step::Write(2));
        assert_eq!(step(10, 10, 4), Step::Rotate);
        assert_eq!(step(11, 10, 1), Step::Rotate, "a file found over the cap");
        assert_eq!(step(0, 10, 0), Step::Write(0));
    }

    /// Everything in the stream's files, read by offset as `job logs` does.
    fn read_all(path: &Path) -> (u64, Vec<u8>) {
        let (mut offset, mut skipped, mut out) = (0, 0, Vec::new());
        loop {
            let chunk = read_at(path, offset, 7).expect("read");
            if chunk.data.is_empty() {
                return (skipped, out);
            }
            skipped += chunk.skipped;
            offset += chunk.skipped + chunk.data.len() as u64;
            out.extend(chunk.data);
        }
    }

    #[test]
    fn at_most_two_files_within_the_cap_and_offsets_survive_rotation() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("stdout.log");
        let mut log = LogFile::open(&path, 10).expect("open");
        let text: Vec<u8> = (0..47u8).map(|i| b'a' + i % 26).collect();
        for piece in text.chunks(6) {
            log.write(piece);
        }
        // 47 bytes, cap 10: 40..47 in the current file, 30..40 in .1; 0..30 rotated away.
        assert_eq!(std::fs::read(&path).expect("current"), &text[40..]);
        assert_eq!(
            std::fs::read(log_files::rotated(&path)).expect("rotated"),
            &text[30..40]
        );
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["stdout.log", "stdout.log.1", "stdout.log.base"]);
        assert_eq!(read_all(&path), (30, text[30..].to_vec()));
        assert_eq!(read_at(&path, 35, 100).expect("read").data, &text[35..40]);
        assert_eq!(read_at(&path, 41, 100).expect("read").data, &text[41..]);
        // Reopened (the offsets carry on from the record).
        drop(log);
        let mut log = LogFile::open(&path, 10).expect("reopen");
        log.write(b"0123");
        // One read returns bytes of one file: 47..50 close the file, 50 starts the next.
        assert_eq!(read_at(&path, 47, 100).expect("read").data, b"012");
        assert_eq!(read_at(&path, 50, 100).expect("read").data, b"3");
        assert_eq!(read_all(&path), (40, b"opqrstu0123".to_vec()));
    }

    #[test]
    fn output_that_cannot_be_written_is_counted_and_said_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("stderr.log");
        let mut log = LogFile::open(&path, 1 << 20).expect("open");
        log.write(b"before\n");
        log.dropped(100, "the log writer could not keep up");
        log.dropped(20, "ignored: the first reason is kept");
        log.write(b"after\n");
        // Lost again at once: said at the end, not every time writing resumes.
        log.dropped(5, "the log writer could not keep up");
        log.write(b"again\n");
        log.say_lost(true);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "before\nafter\n\ngpumesh: 120 bytes of stderr were not kept: the log writer could not keep up\n\
             again\n\ngpumesh: 5 bytes of stderr were not kept: the log writer could not keep up\n"
        );
        // stdout's notices go to another queue (stderr's), not into stdout.log.
        let out = tmp.path().join("stdout.log");
        let queue = Queue::new();
        let mut log = LogFile::open(&out, 1 << 20)
            .expect("open")
            .notices_to(queue.clone());
        log.dropped(7, "the log writer could not keep up");
        log.write(b"data\n");
        assert_eq!(std::fs::read_to_string(&out).expect("read"), "data\n");
        let Some((notice, 0)) = queue.take() else {
            panic!("no notice sent");
        };
        assert_eq!(
            String::from_utf8_lossy(&notice),
            "\ngpumesh: 7 bytes of stdout were not kept: the log writer could not keep up\n"
        );
    }

    #[test]
    fn the_queue_is_bounded_in_bytes_and_never_refuses_a_notice() {
        let q = Queue::new();
        for _ in 0..10_000 {
            q.offer(b"a short line of output\n");
        }
        q.offer(&vec![b'x'; QUEUE_BYTES]);
        q.push(b"notice\n");
        q.close();
        let (data, dropped) = q.take().expect("queued");
        assert_eq!(
            data.len(),
            10_000 * 23 + 7,
            "small writes are all kept, together"
        );
        assert!(data.ends_with(b"notice\n"));
        assert_eq!(dropped, QUEUE_BYTES as u64, "what did not fit is counted");
        assert!(q.take().is_none(), "closed and empty");
    }

    #[test]
    fn the_threads_drain_the_pipes_and_keep_notices_in_order() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (out, err) = (tmp.path().join("stdout.log"), tmp.path().join("stderr.log"));
        let (logs, mut pipes) = JobLogs::start(&out, &err, 4096).expect("start");
        let mut notes = logs.notes();
        notes.write_all(b"gpumesh: a notice\n").expect("note");
        let big = vec![b'x'; 100_000];
        pipes.stdout.write_all(&big).expect("write");
        pipes.stderr.write_all(b"oops\n").expect("write");
        drop(pipes);
        drop(notes);
        drop(logs);
        let (skipped, tail) = read_all(&out);
        assert_eq!(skipped + tail.len() as u64, 100_000);
        assert!(tail.len() <= 2 * 4096);
        assert_eq!(
            std::fs::read_to_string(&err).expect("stderr"),
            "gpumesh: a notice\noops\n"
        );
    }
}
