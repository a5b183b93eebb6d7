//! The journald source's reading of journalctl's export format in native code: one call cuts
//! the whole entries of what was read and makes each one's record — its cursor, its value (the
//! message, or the entry's fields as one JSON object byte for byte what
//! `json.dumps(fields, ensure_ascii=False, separators=(",", ":"))` makes in
//! `agent/tail/journald.py`), its key (a field's first value) and its event time in ms. An
//! entry this code does not take on — a name or, for JSON, a value not UTF-8 (the Python
//! decoding replaces and counts), no cursor, a time that is not plain digits, no message or two
//! for the message form, no key field — comes back without a record, and the Python code makes
//! it (and counts what it must). Never a different answer: where this code is unsure it
//! declines. The cut itself is `agent/tail/journal_export.py`'s: the same entries, the same
//! bytes kept for the next read, the same refusal of a stream out of step.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A binary field longer than this is a stream out of step (journald's DATA_SIZE_MAX).
const MAX_FIELD_BYTES: u64 = 768 << 20;

type Record<'py> = (Py<PyAny>, Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>, i64);
/// (first byte, byte after the blank line, (cursor, (topic, value, key, time ms)) or None).
type Item<'py> = (usize, usize, Option<(String, Record<'py>)>);

/// The reader of one source: its topic (the same object in every record), its form, and the
/// field its key comes from (with the key's longest length).
#[pyclass(module = "docket_native")]
pub struct JournalExport {
    topic: Py<PyAny>,
    json: bool,
    key_field: Option<Vec<u8>>,
    max_key: usize,
}

#[pymethods]
impl JournalExport {
    #[new]
    #[pyo3(signature = (topic, json, key_field = None, max_key = 0))]
    fn new(topic: Py<PyAny>, json: bool, key_field: Option<String>, max_key: usize) -> Self {
        JournalExport { topic, json, key_field: key_field.map(String::into_bytes), max_key }
    }

    /// The whole entries of `buf` from `start` on, each (first byte, byte after its blank
    /// line, (cursor, record) or None where the Python code must make it), and where the
    /// first entry not yet whole begins.
    fn cut<'py>(&self, py: Python<'py>, buf: &Bound<'py, PyBytes>, start: usize)
                -> PyResult<(usize, Vec<Item<'py>>)> {
        let b = buf.as_bytes();
        let n = b.len();
        let mut out = Vec::new();
        let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(32);
        let mut json = Vec::with_capacity(2048);
        let mut begin = start.min(n);
        let mut pos = begin;
        while pos < n {
            let Some(nl) = find(b, b'\n', pos, n) else { break };
            if nl == pos {
                pos = nl + 1;
                if !fields.is_empty() {
                    let item = self.record(py, &fields, &mut json);
                    out.push((begin, pos, item));
                    fields.clear();
                }
                begin = pos;
                continue;
            }
            if let Some(eq) = find(b, b'=', pos, nl) {
                fields.push((&b[pos..eq], &b[eq + 1..nl]));
                pos = nl + 1;
                continue;
            }
            let at = nl + 1;
            if at + 8 > n {
                break;
            }
            let size = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
            if size > MAX_FIELD_BYTES {
                return Err(PyValueError::new_err(format!(
                    "a field of {size} bytes at byte {pos} (not the export format)")));
            }
            let end = at + 8 + size as usize;
            if end >= n {
                break;
            }
            if b[end] != b'\n' {
                return Err(PyValueError::new_err(format!(
                    "the field at byte {pos} does not end with a newline after its length \
                     (not the export format)")));
            }
            fields.push((&b[pos..nl], &b[at + 8..end]));
            pos = end + 1;
        }
        Ok((begin, out))
    }
}

impl JournalExport {
    fn record<'py>(&self, py: Python<'py>, fields: &[(&[u8], &[u8])], json: &mut Vec<u8>)
                   -> Option<(String, Record<'py>)> {
        let cursor = std::str::from_utf8(only(fields, b"__CURSOR")?).ok()?.to_owned();
        let ts = digits(only(fields, b"__REALTIME_TIMESTAMP")?)? / 1000;
        let key = match &self.key_field {
            None => None,
            Some(name) => {
                // The first value; every value UTF-8 (the Python code decodes, and counts, each)
                let mut first = None;
                for &(k, v) in fields {
                    if k == name.as_slice() {
                        std::str::from_utf8(v).ok()?;
                        first.get_or_insert(v);
                    }
                }
                let v = first?;
                Some(PyBytes::new(py, &v[..v.len().min(self.max_key)]))
            }
        };
        let value = if self.json {
            fields.iter().find(|(k, _)| *k == b"MESSAGE")?;     // none: counted in Python
            self.render(fields, json)?;
            PyBytes::new(py, json)
        } else {
            PyBytes::new(py, only(fields, b"MESSAGE")?)
        };
        Some((cursor, (self.topic.clone_ref(py), value, key, ts as i64)))
    }

    /// `{"NAME":"value",...}`: names in the order first seen, a name given again gathering
    /// its values in a list; None when a name or a value is not UTF-8.
    fn render(&self, fields: &[(&[u8], &[u8])], out: &mut Vec<u8>) -> Option<()> {
        // (name, first value, the values after it: empty, and not allocated, for most)
        let mut names: Vec<(&[u8], &[u8], Vec<&[u8]>)> = Vec::with_capacity(fields.len());
        let mut seen = 0u64;
        for &(k, v) in fields {
            std::str::from_utf8(v).ok()?;
            let bit = name_bit(k);
            let earlier = if seen & bit != 0 {
                names.iter_mut().find(|(name, _, _)| *name == k)
            } else {
                None
            };
            seen |= bit;
            match earlier {
                Some((_, _, more)) => more.push(v),
                None => {
                    std::str::from_utf8(k).ok()?;
                    names.push((k, v, Vec::new()));
                }
            }
        }
        out.clear();
        out.push(b'{');
        for (i, (k, first, more)) in names.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            string(out, k);
            out.push(b':');
            if more.is_empty() {
                string(out, first);
                continue;
            }
            out.push(b'[');
            string(out, first);
            for v in more {
                out.push(b',');
                string(out, v);
            }
            out.push(b']');
        }
        out.push(b'}');
        Some(())
    }
}

fn find(b: &[u8], what: u8, from: usize, to: usize) -> Option<usize> {
    memchr::memchr(what, &b[from..to]).map(|i| from + i)
}

/// A bit of a 64-bit set standing for a field name: names of different bits differ, so only a
/// name whose bit is set already is looked for among the names before it.
fn name_bit(k: &[u8]) -> u64 {
    let last = k.last().copied().unwrap_or(0) as usize;
    1 << ((k.len() * 7 + last) % 64)
}

/// The value of the field `name` when the entry has it exactly once.
fn only<'a>(fields: &[(&'a [u8], &'a [u8])], name: &[u8]) -> Option<&'a [u8]> {
    let mut found = None;
    for &(k, v) in fields {
        if k == name {
            if found.is_some() {
                return None;
            }
            found = Some(v);
        }
    }
    found
}

/// A number of 1 to 18 ASCII digits (what Python's `int` reads the same way).
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 18 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// A JSON string of UTF-8 text as Python's json writes it with `ensure_ascii=False`: `"`, `\`
/// and the control characters escaped (`\n`, `\r`, `\t`, `\b`, `\f`, the rest `\u00xx`); of
/// printable ASCII (the syslog source's messages) only `"` and `\`.
pub(crate) fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    let mut from = 0;
    for (i, &c) in s.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&s[from..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 15) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        from = i + 1;
    }
    out.extend_from_slice(&s[from..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_python_does() {
        let mut out = Vec::new();
        string(&mut out, "a\"b\\c\nd\x01é\x7f".as_bytes());
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\u0001é\x7f\"".as_bytes());
    }

    #[test]
    fn digits_only() {
        assert_eq!(digits(b"1790000000003000"), Some(1_790_000_000_003_000));
        assert_eq!(digits(b""), None);
        assert_eq!(digits(b"+1"), None);
        assert_eq!(digits(b"1234567890123456789"), None);
    }
}
