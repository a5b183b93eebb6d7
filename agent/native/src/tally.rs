//! The audit's tally of a sealed slot in one native pass: per event-time window, the records'
//! count, value bytes, checksum (the sum of their values' XXH64, wrapping) and how many were
//! late, walking the slot's blocks as `agent/buffer/framing.py` frames them. A slot sent while
//! it fills holds a block per turn (a thousand at 1,000 lines/s): walked in Python, each block
//! cost some 20 µs, and the seal of that slot held the agent's loop for 16-32 ms once a second.

use std::collections::BTreeMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::{contiguous, items};

const BLOCK_MAGIC: u32 = 0x4B43_4C42; // b"BLCK"
const BLOCK_HEADER_BYTES: usize = 24;
const PER_RECORD_BYTES: usize = 16; // timestamp (8) + length (4) + offset (4)
const HAS_KEYS: u16 = 1;

/// One window's figures: (count, value bytes, checksum, late).
type Figures = (u64, u64, u64, u64);

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// A block's bytes (`framing.block_bytes`), or None where they overflow.
fn block_size(n: usize, data_len: usize, keyed: bool, keys_len: usize) -> Option<usize> {
    let mut size = PER_RECORD_BYTES.checked_mul(n)?.checked_add(BLOCK_HEADER_BYTES)?
        .checked_add(data_len.checked_add(7)? & !7)?;
    if keyed {
        size = size.checked_add(n.checked_mul(2)?.checked_add(7)? & !7)?
            .checked_add(keys_len.checked_add(7)? & !7)?;
    }
    Some(size)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

/// The tally of `payload` (a slot's used bytes), by window start; an error names the first
/// block or record that does not fit the framing.
pub(crate) fn tally(payload: &[u8], window_ms: i64, now_ms: i64, seed: u64)
                    -> Result<BTreeMap<i64, Figures>, String> {
    if window_ms <= 0 {
        return Err(format!("window_ms must be positive, not {window_ms}"));
    }
    let end = payload.len();
    let mut out: BTreeMap<i64, Figures> = BTreeMap::new();
    let mut at = 0usize;
    while at < end {
        if at + BLOCK_HEADER_BYTES > end {
            return Err(format!("block header at {at} runs past the payload end {end}"));
        }
        if u32_at(payload, at) != BLOCK_MAGIC {
            return Err(format!("no block magic at payload offset {at}"));
        }
        let n = u32_at(payload, at + 4) as usize;
        let keyed = u16_at(payload, at + 8) & HAS_KEYS != 0;
        let data_len = u32_at(payload, at + 16) as usize;
        let keys_len = u32_at(payload, at + 20) as usize;
        // Checked: on a 32-bit build a corrupt header's sizes could wrap past the checks.
        let size = block_size(n, data_len, keyed, keys_len)
            .filter(|size| at.checked_add(*size).is_some_and(|e| e <= end))
            .ok_or_else(|| format!("block at {at} runs past the payload end {end}"))?;
        let keys_bytes = if keyed { pad8(2 * n) + pad8(keys_len) } else { 0 };
        let ts_at = at + BLOCK_HEADER_BYTES;
        let len_at = ts_at + 8 * n;
        let off_at = len_at + 4 * n;
        let data_at = off_at + 4 * n + keys_bytes;
        for i in 0..n {
            let length = u32_at(payload, len_at + 4 * i) as usize;
            let offset = u32_at(payload, off_at + 4 * i) as usize;
            if offset.checked_add(length).is_none_or(|e| e > data_len) {
                return Err(format!("a record of the block at {at} points past its data"));
            }
            let value = &payload[data_at + offset..data_at + offset + length];
            // As numpy computes it (`ts // window_ms * window_ms`, `+ window_ms`): wrapping.
            let window = i64_at(payload, ts_at + 8 * i).div_euclid(window_ms)
                .wrapping_mul(window_ms);
            let f = out.entry(window).or_insert((0, 0, 0, 0));
            f.0 += 1;
            f.1 += length as u64;
            f.2 = f.2.wrapping_add(xxhash_rust::xxh64::xxh64(value, seed));
            if window.wrapping_add(window_ms) <= now_ms {
                f.3 += 1;
            }
        }
        at += size;
    }
    Ok(out)
}

/// `tally` for Python: [(window start, count, bytes, checksum, late)] in window order, with
/// the GIL released while it walks.
#[pyfunction]
pub(crate) fn slot_tally(py: Python<'_>, payload: &Bound<'_, PyAny>, window_ms: i64,
                         now_ms: i64, seed: u64)
                         -> PyResult<Vec<(i64, u64, u64, u64, u64)>> {
    let payload = contiguous::<u8>(payload, "payload")?;
    // SAFETY: the buffer stays exported (held above) while the slice lives.
    let data = unsafe { items(&payload) };
    let figures = py.detach(|| tally(data, window_ms, now_ms, seed))
        .map_err(PyValueError::new_err)?;
    Ok(figures.into_iter().map(|(w, (c, b, s, l))| (w, c, b, s, l)).collect())
}

#[cfg(test)]
mod tests {
    use super::tally;

    fn block(times: &[i64], values: &[&[u8]]) -> Vec<u8> {
        let n = times.len();
        let data: Vec<u8> = values.concat();
        let mut b = Vec::new();
        for v in [0x4B43_4C42u32, n as u32] {
            b.extend(v.to_le_bytes());
        }
        b.extend([0u8; 8]);                                  // flags, part fields, pad
        b.extend((data.len() as u32).to_le_bytes());
        b.extend(0u32.to_le_bytes());
        for t in times {
            b.extend(t.to_le_bytes());
        }
        for v in values {
            b.extend((v.len() as u32).to_le_bytes());
        }
        let mut offset = 0u32;
        for v in values {
            b.extend(offset.to_le_bytes());
            offset += v.len() as u32;
        }
        b.extend(&data);
        b.resize(b.len() + (8 - data.len() % 8) % 8, 0);
        b
    }

    #[test]
    fn records_are_counted_by_their_window_and_lateness() {
        let mut p = block(&[1_000, 59_999], &[b"a", b"bc"]);
        p.extend(block(&[60_000], &[b"def"]));
        let t = tally(&p, 60_000, 120_000, 0).unwrap();
        assert_eq!(t.len(), 2);
        let (c, b, _, late) = t[&0];
        assert_eq!((c, b, late), (2, 3, 2));
        let (c, b, _, late) = t[&60_000];
        assert_eq!((c, b, late), (1, 3, 1));
        assert_eq!(tally(&p, 60_000, 119_999, 0).unwrap()[&60_000].3, 0);
    }

    #[test]
    fn a_payload_that_breaks_the_framing_is_an_error() {
        let p = block(&[1], &[b"x"]);
        assert!(tally(&p[..p.len() - 8], 60_000, 0, 0).unwrap_err().contains("runs past"));
        let mut huge = p.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());      // n
        assert!(tally(&huge, 60_000, 0, 0).unwrap_err().contains("runs past"));
        let mut bad = p.clone();
        bad[0] = 0;
        assert!(tally(&bad, 60_000, 0, 0).unwrap_err().contains("no block magic"));
        let mut far = p.clone();
        far[32] = 9;                                         // the record's length
        assert!(tally(&far, 60_000, 0, 0).unwrap_err().contains("points past"));
    }
}
