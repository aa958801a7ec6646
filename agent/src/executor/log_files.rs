//! The files of one output stream of a run, and reading them by stream offset.
//!
//! A stream (stdout or stderr) is everything the job wrote to it, numbered from byte 0. On disk
//! it is at most two files: `stdout.log` (the current file) and `stdout.log.1` (the file before
//! it, replaced at each rotation), plus `stdout.log.base`, which says where the current file
//! starts in the stream and names that file by inode. An offset therefore means the same byte
//! before and after a rotation, so a reader that resumes at the offset it reached (a `-f`
//! follower, or `gpuctl` reconnecting through another agent) neither repeats nor loses output,
//! unless that output was rotated away, which it is told.
//!
//! The writer (`log_writer.rs`) rotates in this order: create `stdout.log.next`, write the base
//! record naming its inode, rename `stdout.log` to `stdout.log.1`, rename `stdout.log.next` to
//! `stdout.log`. A reader that opens the files mid-way sees a record whose inode is not the
//! current file's (or no current file) and looks again.

use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `<current>.1`: the file before the current one.
pub(crate) fn rotated(current: &Path) -> PathBuf {
    with_suffix(current, ".1")
}

/// `<current>.base`: where the current file starts in the stream.
pub(crate) fn base_record(current: &Path) -> PathBuf {
    with_suffix(current, ".base")
}

/// `<current>.next`: the next current file while a rotation is under way.
pub(crate) fn next(current: &Path) -> PathBuf {
    with_suffix(current, ".next")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// The content of `<current>.base`: the current file's inode and its first byte's offset in
/// the stream, with a check value so a torn or foreign record is not believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BaseRecord {
    pub ino: u64,
    pub base: u64,
}

impl BaseRecord {
    fn check(self) -> u64 {
        (self.ino ^ self.base.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    pub(crate) fn encode(self) -> String {
        format!("{} {} {:x}\n", self.ino, self.base, self.check())
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut f = text.split_whitespace();
        let r = Self {
            ino: f.next()?.parse().ok()?,
            base: f.next()?.parse().ok()?,
        };
        let check = u64::from_str_radix(f.next()?, 16).ok()?;
        (f.next().is_none() && check == r.check()).then_some(r)
    }
}

/// One file's part of the stream: it holds bytes `base .. base + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub base: u64,
    pub len: u64,
}

impl Span {
    fn end(self) -> u64 {
        self.base + self.len
    }
}

/// Where a stream offset is, given the files there now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// In the rotated file, at this position.
    Older(u64),
    /// In the current file, at this position.
    Current(u64),
    /// Rotated away: the oldest byte still kept is at this stream offset.
    Gone { resume_at: u64 },
    /// At or past the end: nothing to read yet.
    End,
}

/// Pure: where `offset` falls among the rotated file (if any) and the current one.
pub(crate) fn place(offset: u64, older: Option<Span>, current: Span) -> Place {
    let oldest = older.map_or(current.base, |o| o.base);
    if offset < oldest {
        return Place::Gone { resume_at: oldest };
    }
    if let Some(o) = older
        && offset < o.end()
    {
        return Place::Older(offset - o.base);
    }
    if offset >= current.end() {
        return Place::End;
    }
    if offset >= current.base {
        return Place::Current(offset - current.base);
    }
    // Between the rotated file's end and the current file's start: not written by our writer,
    // but never hand out a position before the current file.
    Place::Gone {
        resume_at: current.base,
    }
}

/// What one read returned: `skipped` bytes of the stream were rotated away before `data`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub skipped: u64,
    pub data: Vec<u8>,
}

/// The files as one consistent view.
struct Files {
    older: Option<(File, Span)>,
    current: (File, Span),
}

/// How often a reader looks again while a rotation is under way (it takes microseconds), and
/// for how long before it settles for the files as they are.
const SETTLE_TRIES: u32 = 50;
const SETTLE_PAUSE: Duration = Duration::from_millis(2);

/// Read up to `max` bytes of the stream whose current file is `current`, from stream offset
/// `offset`. Missing files read as an empty stream (the run has not written yet).
pub(crate) fn read_at(current: &Path, offset: u64, max: usize) -> std::io::Result<Chunk> {
    let Some(files) = open(current)? else {
        return Ok(Chunk::default());
    };
    let older_span = files.older.as_ref().map(|(_, s)| *s);
    let (skipped, offset) = match place(offset, older_span, files.current.1) {
        Place::Gone { resume_at } => (resume_at - offset, resume_at),
        _ => (0, offset),
    };
    let (file, pos) = match place(offset, older_span, files.current.1) {
        Place::Older(pos) => (files.older.as_ref().map(|(f, _)| f), pos),
        Place::Current(pos) => (Some(&files.current.0), pos),
        Place::Gone { .. } | Place::End => (None, 0),
    };
    let mut data = vec![0; max];
    let n = match file {
        Some(f) => f.read_at(&mut data, pos)?,
        None => 0,
    };
    data.truncate(n);
    Ok(Chunk { skipped, data })
}

/// Open the current and rotated files and learn where each starts, retrying while a rotation
/// is under way. After `SETTLE_TRIES` (a writer that died mid-rotation) the rotated file is
/// taken to end where the current one starts.
fn open(current: &Path) -> std::io::Result<Option<Files>> {
    let mut tries = 0;
    loop {
        tries += 1;
        let settled = tries >= SETTLE_TRIES;
        match try_open(current, settled)? {
            Some(Attempt::Files(f)) => return Ok(Some(f)),
            Some(Attempt::Rotating) if !settled => std::thread::sleep(SETTLE_PAUSE),
            Some(Attempt::Rotating) | None => return Ok(None),
        }
    }
}

enum Attempt {
    Files(Files),
    /// The files and the record disagree: a rotation is under way.
    Rotating,
}

fn open_opt(path: &Path) -> std::io::Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn try_open(current: &Path, settled: bool) -> std::io::Result<Option<Attempt>> {
    let Some(cur) = open_opt(current)? else {
        // Between the two renames of a rotation there is no current file for a moment.
        return Ok(if rotated(current).exists() && !settled {
            Some(Attempt::Rotating)
        } else {
            None
        });
    };
    let cur_meta = cur.metadata()?;
    let older = match open_opt(&rotated(current))? {
        Some(f) => {
            let meta = f.metadata()?;
            if meta.ino() == cur_meta.ino() {
                // Rotated between our two opens: what we opened as current is now the older.
                return Ok(Some(Attempt::Rotating));
            }
            Some((f, meta.len()))
        }
        None => None,
    };
    let record = std::fs::read_to_string(base_record(current))
        .ok()
        .and_then(|t| BaseRecord::parse(&t));
    let base = match (record, &older) {
        (Some(r), _) if r.ino == cur_meta.ino() => r.base,
        // Never rotated: the current file is the whole stream.
        (None, None) => 0,
        _ if !settled => return Ok(Some(Attempt::Rotating)),
        // Settle for the files as they are: the rotated file first, then the current one.
        (_, older) => older.as_ref().map_or(0, |(_, len)| *len),
    };
    let older = older.map(|(f, len)| {
        (
            f,
            Span {
                base: base.saturating_sub(len),
                len,
            },
        )
    });
    Ok(Some(Attempt::Files(Files {
        older,
        current: (
            cur,
            Span {
                base,
                len: cur_meta.len(),
            },
        ),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn span(base: u64, len: u64) -> Span {
        Span { base, len }
    }

    #[test]
    fn an_offset_is_placed_across_the_rotation() {
        // Never rotated: one file from 0.
        let cur = span(0, 10);
        assert_eq!(place(0, None, cur), Place::Current(0));
        assert_eq!(place(9, None, cur), Place::Current(9));
        assert_eq!(place(10, None, cur), Place::End);
        assert_eq!(place(99, None, cur), Place::End);
        // Rotated twice with a cap of 100: .1 holds 100..200, current 200..250.
        let (older, cur) = (Some(span(100, 100)), span(200, 50));
        assert_eq!(place(0, older, cur), Place::Gone { resume_at: 100 });
        assert_eq!(place(99, older, cur), Place::Gone { resume_at: 100 });
        assert_eq!(place(100, older, cur), Place::Older(0));
        assert_eq!(place(199, older, cur), Place::Older(99));
        assert_eq!(place(200, older, cur), Place::Current(0));
        assert_eq!(place(249, older, cur), Place::Current(49));
        assert_eq!(place(250, older, cur), Place::End);
        // The rotated file alone gone (removed by hand): resume at the current file.
        assert_eq!(place(5, None, cur), Place::Gone { resume_at: 200 });
        // A gap between the files resumes at the current file.
        assert_eq!(
            place(160, Some(span(100, 50)), cur),
            Place::Gone { resume_at: 200 }
        );
    }

    #[test]
    fn base_records_round_trip_and_torn_ones_are_refused() {
        let r = BaseRecord {
            ino: 1234567,
            base: 64 << 20,
        };
        assert_eq!(BaseRecord::parse(&r.encode()), Some(r));
        let text = r.encode();
        // A record read while it was being replaced: old digits mixed with new.
        let torn = text.replacen("1234567", "1234568", 1);
        assert_eq!(BaseRecord::parse(&torn), None);
        for junk in ["", "1 2", "1 2 3 4", "x 2 3", "1 2 zz"] {
            assert_eq!(BaseRecord::parse(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn reading_follows_the_files_on_disk() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cur = tmp.path().join("stdout.log");
        assert_eq!(read_at(&cur, 0, 64).expect("read"), Chunk::default());
        std::fs::write(&cur, b"hello").expect("write");
        assert_eq!(read_at(&cur, 1, 2).expect("read").data, b"el");
        // Rotated once: "hello" is bytes 0..5 in .1; the new current starts at 5.
        std::fs::rename(&cur, rotated(&cur)).expect("rotate");
        std::fs::write(&cur, b"world").expect("write");
        let ino = std::fs::metadata(&cur).expect("meta").ino();
        std::fs::write(base_record(&cur), BaseRecord { ino, base: 5 }.encode()).expect("record");
        assert_eq!(read_at(&cur, 3, 64).expect("read").data, b"lo");
        assert_eq!(read_at(&cur, 5, 64).expect("read").data, b"world");
        assert_eq!(read_at(&cur, 10, 64).expect("read"), Chunk::default());
        // Rotated again: "hello" is gone, a reader at 2 is told 3 bytes were skipped.
        std::fs::rename(&cur, rotated(&cur)).expect("rotate");
        std::fs::write(&cur, b"!").expect("write");
        let ino = std::fs::metadata(&cur).expect("meta").ino();
        std::fs::write(base_record(&cur), BaseRecord { ino, base: 10 }.encode()).expect("record");
        assert_eq!(
            read_at(&cur, 2, 64).expect("read"),
            Chunk {
                skipped: 3,
                data: b"world".to_vec()
            }
        );
        assert_eq!(read_at(&cur, 10, 64).expect("read").data, b"!");
        // A record that names another file (a writer that died mid-rotation) is given up on
        // after a while: the rotated file is read as ending where the current one starts.
        std::fs::write(
            base_record(&cur),
            BaseRecord {
                ino: ino + 1,
                base: 10,
            }
            .encode(),
        )
        .expect("record");
        assert_eq!(read_at(&cur, 0, 64).expect("read").data, b"world");
    }
}
