//! A file of fixed-width slots, slot `i` holding `N` little-endian u64s at byte `i * 8N`: a
//! dense index from a number (a job id, an audit sequence number) to where its record lies, or
//! a list appended in order. An all-zero slot is empty, so a hole in a sparse file reads as
//! empty. Nothing is durable until `sync`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use crate::storage::record_file::open_or_create;

/// Slots read per call when going through a range.
const CHUNK: u64 = 4096;

#[derive(Debug)]
pub(crate) struct SlotFile<const N: usize> {
    file: File,
    /// Slots the file spans; `push` and `set` past the end hold it.
    len: Mutex<u64>,
}

pub(crate) type Slot<const N: usize> = [u64; N];

impl<const N: usize> SlotFile<N> {
    const WIDTH: u64 = 8 * N as u64;

    /// Open (creating) the file at `path`, cut to `keep` slots when it spans more (`None`:
    /// keep them all).
    pub(crate) fn open(path: &Path, keep: Option<u64>) -> io::Result<Self> {
        let file = open_or_create(path)?;
        let mut len = file.metadata()?.len() / Self::WIDTH;
        if let Some(keep) = keep.filter(|keep| *keep < len) {
            file.set_len(keep * Self::WIDTH)?;
            len = keep;
        }
        Ok(Self {
            file,
            len: Mutex::new(len),
        })
    }

    /// How many slots the file spans.
    pub(crate) fn len(&self) -> u64 {
        *self.lock()
    }

    /// Slot `i`, `None` when it is empty or past the end.
    pub(crate) fn get(&self, i: u64) -> io::Result<Option<Slot<N>>> {
        Ok(self.range(i, i.saturating_add(1))?.pop().flatten())
    }

    /// Slots `from..to`, each `None` when it is empty or past the end.
    pub(crate) fn range(&self, from: u64, to: u64) -> io::Result<Vec<Option<Slot<N>>>> {
        let mut slots = vec![None; to.saturating_sub(from) as usize];
        let held = to.min(self.len());
        if from < held {
            let mut bytes = vec![0u8; ((held - from) * Self::WIDTH) as usize];
            self.file.read_exact_at(&mut bytes, from * Self::WIDTH)?;
            for (slot, raw) in slots
                .iter_mut()
                .zip(bytes.chunks_exact(Self::WIDTH as usize))
            {
                *slot = decode(raw);
            }
        }
        Ok(slots)
    }

    /// Slots `from..to` with their numbers, read a chunk at a time.
    pub(crate) fn iter(
        &self,
        from: u64,
        to: u64,
    ) -> impl Iterator<Item = io::Result<(u64, Option<Slot<N>>)>> + '_ {
        (from..to).step_by(CHUNK as usize).flat_map(move |start| {
            let slots = self.range(start, to.min(start + CHUNK));
            let items: Vec<_> = match slots {
                Ok(slots) => (start..).zip(slots).map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            items
        })
    }

    /// Write slot `i` (never all zeros: that reads as empty), growing the file if needed.
    pub(crate) fn set(&self, i: u64, slot: Slot<N>) -> io::Result<()> {
        let mut len = self.lock();
        self.file.write_all_at(&encode(slot), i * Self::WIDTH)?;
        *len = (*len).max(i + 1);
        Ok(())
    }

    /// Append a slot; returns its number.
    pub(crate) fn push(&self, slot: Slot<N>) -> io::Result<u64> {
        let mut len = self.lock();
        self.file.write_all_at(&encode(slot), *len * Self::WIDTH)?;
        *len += 1;
        Ok(*len - 1)
    }

    /// Empty slot `i`.
    pub(crate) fn clear(&self, i: u64) -> io::Result<()> {
        let _len = self.lock();
        self.file.write_all_at(&encode([0; N]), i * Self::WIDTH)
    }

    /// Make every earlier write durable; returns how many slots the file spans.
    pub(crate) fn sync(&self) -> io::Result<u64> {
        let len = self.len();
        self.file.sync_data()?;
        Ok(len)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.len.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn encode<const N: usize>(slot: Slot<N>) -> Vec<u8> {
    slot.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn decode<const N: usize>(raw: &[u8]) -> Option<Slot<N>> {
    let mut slot = [0u64; N];
    for (word, bytes) in slot.iter_mut().zip(raw.chunks_exact(8)) {
        *word = u64::from_le_bytes(bytes.try_into().unwrap_or_default());
    }
    (slot != [0; N]).then_some(slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_dense_holes_read_empty_and_open_cuts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("slots");
        let slots = SlotFile::<2>::open(&path, None).expect("open");
        slots.set(5, [7, 8]).expect("set");
        assert_eq!(slots.len(), 6);
        assert_eq!(slots.get(5).expect("get"), Some([7, 8]));
        assert_eq!(slots.get(2).expect("get"), None, "a hole");
        assert_eq!(slots.get(9).expect("get"), None, "past the end");
        assert_eq!(slots.push([1, 1]).expect("push"), 6);
        slots.clear(5).expect("clear");
        let all: Vec<_> = slots.iter(4, 8).map(|s| s.expect("read")).collect();
        assert_eq!(
            all,
            vec![(4, None), (5, None), (6, Some([1, 1])), (7, None)]
        );
        drop(slots);

        let slots = SlotFile::<2>::open(&path, Some(3)).expect("reopen");
        assert_eq!(slots.len(), 3);
        assert_eq!(slots.get(6).expect("get"), None);
    }

    #[test]
    fn iteration_crosses_chunks() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let slots = SlotFile::<1>::open(&tmp.path().join("slots"), None).expect("open");
        for i in 0..CHUNK * 2 + 5 {
            slots.push([i + 1]).expect("push");
        }
        let read: Vec<u64> = (slots.iter(3, slots.len()))
            .map(|s| s.expect("read").1.expect("full")[0])
            .collect();
        assert_eq!(read, (4..=CHUNK * 2 + 5).collect::<Vec<_>>());
    }
}
