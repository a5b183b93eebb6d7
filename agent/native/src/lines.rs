//! A multiline rule's pattern matched against every line of a read in one call
//! (`agent/tail/multiline.py`): the Python code otherwise asks RE2 once per matching line, and
//! that call, not the scan, was most of what joining lines into events cost.
//!
//! The engine is the `regex` crate's, linear in the text as RE2 is. The Python code hands it a
//! pattern only where both engines mean the same by it (`multiline.rust_pattern`: RE2's ASCII
//! `\d`, `\w`, `\s` and `\b` spelled out, the rest left to RE2).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use regex::bytes::{Regex, RegexBuilder};

use crate::{contiguous, items, writable};

/// One pattern, matched against lines alone (`^` and `$` are a line's ends).
#[pyclass(module = "docket_native", frozen)]
pub struct LineMatcher {
    re: Regex,
}

#[pymethods]
impl LineMatcher {
    /// ValueError where the engine cannot compile `pattern`.
    #[new]
    fn new(pattern: &str) -> PyResult<Self> {
        RegexBuilder::new(pattern)
            .build()
            .map(|re| LineMatcher { re })
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// For each line `data[starts[i]..ends[i]]` (int64 offsets, ends exclusive of the
    /// newline): 1 in `out[i]` (uint8, one per line) where the pattern matches the line alone,
    /// else 0; with the GIL released. False, with nothing written, where the lines are not
    /// UTF-8 throughout: RE2 takes some sequences the crate does not (a surrogate's, an
    /// overlong one) for characters, so RE2 decides those.
    fn matching(&self, py: Python<'_>, data: &Bound<'_, PyAny>, starts: &Bound<'_, PyAny>,
                ends: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>) -> PyResult<bool> {
        let data = contiguous::<u8>(data, "data")?;
        let starts = contiguous::<i64>(starts, "starts")?;
        let ends = contiguous::<i64>(ends, "ends")?;
        let out = writable::<u8>(out, "out")?;
        let n = starts.item_count();
        if ends.item_count() != n || out.item_count() != n {
            return Err(PyValueError::new_err(format!(
                "starts ({n}), ends ({}) and out ({}) must have one entry per line",
                ends.item_count(), out.item_count())));
        }
        // SAFETY: the buffers stay exported (held above) while the slices live.
        let (text, firsts, lasts) = unsafe { (items(&data), items(&starts), items(&ends)) };
        let (mut lo, mut hi) = (text.len(), 0);     // the bytes the lines span
        for (i, (&a, &e)) in firsts.iter().zip(lasts).enumerate() {
            if a < 0 || e < a || e as usize > text.len() {
                return Err(PyValueError::new_err(format!(
                    "line {i}: bytes {a}..{e} lie outside the data ({} bytes)", text.len())));
            }
            lo = lo.min(a as usize);
            hi = hi.max(e as usize);
        }
        let (o, t) = (out.buf_ptr() as usize, data.buf_ptr() as usize);
        if n > 0 && o < t + text.len() && t < o + n {
            return Err(PyValueError::new_err("out and data must not overlap"));
        }
        // SAFETY: `out` is a writable, contiguous buffer of n bytes the caller holds while
        // this runs, apart from `data` (checked), and nothing else writes it meanwhile.
        let hits = unsafe { std::slice::from_raw_parts_mut(out.buf_ptr() as *mut u8, n) };
        let re = &self.re;
        Ok(py.detach(|| {
            if std::str::from_utf8(&text[lo..hi.max(lo)]).is_err() {
                return false;
            }
            for ((h, &a), &e) in hits.iter_mut().zip(firsts).zip(lasts) {
                *h = re.is_match(&text[a as usize..e as usize]) as u8;   // checked above
            }
            true
        }))
    }
}

#[cfg(test)]
mod tests {
    use regex::bytes::Regex;

    #[test]
    fn a_line_alone_anchors_at_its_own_ends() {
        let re = Regex::new(r"^\d{4} x$").unwrap();
        let text = b"2026 x\nab 2026 x\n";
        assert!(re.is_match(&text[0..6]));
        assert!(!re.is_match(&text[7..16]));
    }
}
