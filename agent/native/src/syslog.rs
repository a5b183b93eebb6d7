//! The syslog source's JSON form of a message, made in native code for the common message: one
//! call turns a batch of messages into their JSON objects, byte for byte what
//! `agent/tail/syslog_format.py` and `json.dumps(..., ensure_ascii=False, separators=(",", ":"))`
//! make of them. A message this code does not take on — any byte outside printable ASCII (so
//! no decoding, no escape beyond `"` and `\`, no Unicode class in a pattern), an RFC 3164
//! time that does not resolve in the common way, anything unparsable — comes back as `None`,
//! and the Python parse makes it (and counts what it must). Never a different answer: where
//! this code is unsure it declines.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::journal::string;

const MONTHS: [&[u8]; 12] = [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug",
                             b"Sep", b"Oct", b"Nov", b"Dec"];

/// The renderer of one source: the facility and severity names (from the Python module, so
/// there is one list of them), and the JSON text of the fields every message gains after
/// `peer` (the source's `add_fields`, already rendered: `,"k":"v"...` or empty).
#[pyclass(module = "docket_native")]
pub struct SyslogJson {
    facilities: Vec<String>,
    severities: Vec<String>,
    suffix: String,
}

#[pymethods]
impl SyslogJson {
    #[new]
    fn new(facilities: Vec<String>, severities: Vec<String>, suffix: String) -> Self {
        SyslogJson { facilities, severities, suffix }
    }

    /// The JSON objects of `messages` (bytes each, framing removed), each with the JSON text
    /// of its sender from `peers` (one for all, or one per message); `None` where the Python
    /// parse must make it. `now_us`: the receiver's wall time in µs since the epoch, read in
    /// its zone `offset_s` east of UTC (a whole number of minutes): an RFC 3164 time is read
    /// there.
    fn render<'py>(&self, py: Python<'py>, messages: Vec<Bound<'py, PyBytes>>,
                   peers: Vec<String>, now_us: i64, offset_s: i32)
                   -> PyResult<Bound<'py, PyList>> {
        if peers.len() != 1 && peers.len() != messages.len() {
            return Err(PyValueError::new_err(format!(
                "{} peers for {} messages: one for all, or one each", peers.len(),
                messages.len())));
        }
        let out = PyList::empty(py);
        let clock = Clock::new(now_us, offset_s);
        let mut buf = Vec::with_capacity(512);
        for (i, m) in messages.iter().enumerate() {
            let peer = if peers.len() == 1 { &peers[0] } else { &peers[i] };
            buf.clear();
            if self.json(m.as_bytes(), peer, &clock, &mut buf) {
                out.append(PyBytes::new(py, &buf))?;
            } else {
                out.append(py.None())?;
            }
        }
        Ok(out)
    }
}

impl SyslogJson {
    fn json(&self, m: &[u8], peer: &str, clock: &Clock, out: &mut Vec<u8>) -> bool {
        if !m.iter().all(|&b| (0x20..=0x7e).contains(&b)) {
            return false;
        }
        let Some((pri, at)) = pri(m) else { return false };
        if pri > 191 {
            return false;
        }
        let rest = &m[at..];
        let fields = if version(rest) {
            rfc5424(rest)
        } else {
            rfc3164(rest, clock)
        };
        let Some(f) = fields else { return false };
        out.extend_from_slice(b"{\"facility\":");
        string(out, self.facilities[(pri >> 3) as usize].as_bytes());
        out.extend_from_slice(b",\"severity\":");
        string(out, self.severities[(pri & 7) as usize].as_bytes());
        out.extend_from_slice(b",\"timestamp\":");
        match &f.timestamp {
            Stamp::None => out.extend_from_slice(b"null"),
            Stamp::Given(s) => string(out, s),
            Stamp::Made(s) => string(out, s.as_bytes()),
        }
        for (name, value) in [(&b",\"host\":"[..], f.host), (b",\"app\":", f.app),
                              (b",\"procid\":", f.procid), (b",\"msgid\":", f.msgid)] {
            out.extend_from_slice(name);
            nullable(out, value);
        }
        out.extend_from_slice(b",\"structured_data\":");
        match &f.sd {
            None => out.extend_from_slice(b"null"),
            Some(elements) => {
                out.push(b'{');
                for (k, (id, params)) in elements.iter().enumerate() {
                    if k > 0 {
                        out.push(b',');
                    }
                    string(out, id);
                    out.extend_from_slice(b":{");
                    for (j, (name, values)) in params.iter().enumerate() {
                        if j > 0 {
                            out.push(b',');
                        }
                        string(out, name);
                        out.push(b':');
                        if values.len() == 1 {
                            string(out, &values[0]);
                        } else {
                            out.push(b'[');
                            for (v, value) in values.iter().enumerate() {
                                if v > 0 {
                                    out.push(b',');
                                }
                                string(out, value);
                            }
                            out.push(b']');
                        }
                    }
                    out.push(b'}');
                }
                out.push(b'}');
            }
        }
        out.extend_from_slice(b",\"message\":");
        string(out, f.message);
        out.extend_from_slice(b",\"protocol\":");
        string(out, if f.is_5424 { b"rfc5424" } else { b"rfc3164" });
        out.extend_from_slice(b",\"peer\":");
        out.extend_from_slice(peer.as_bytes());
        out.extend_from_slice(self.suffix.as_bytes());
        out.push(b'}');
        true
    }
}

fn nullable(out: &mut Vec<u8>, s: Option<&[u8]>) {
    match s {
        Some(s) => string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

enum Stamp<'a> {
    None,
    Given(&'a [u8]),
    Made(String),
}

/// One element of STRUCTURED-DATA: its id and its parameters in first-seen order, a name given
/// again gathering its values.
type Element<'a> = (&'a [u8], Vec<(&'a [u8], Vec<Vec<u8>>)>);

struct Fields<'a> {
    timestamp: Stamp<'a>,
    host: Option<&'a [u8]>,
    app: Option<&'a [u8]>,
    procid: Option<&'a [u8]>,
    msgid: Option<&'a [u8]>,
    sd: Option<Vec<Element<'a>>>,
    message: &'a [u8],
    is_5424: bool,
}

fn digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// `<PRI>` at the start: its value and where the rest begins.
fn pri(m: &[u8]) -> Option<(u32, usize)> {
    if m.first() != Some(&b'<') {
        return None;
    }
    let n = m[1..].iter().take(4).take_while(|&&b| digit(b)).count();
    if n == 0 || n > 3 || m.get(1 + n) != Some(&b'>') {
        return None;
    }
    let value = m[1..1 + n].iter().fold(0u32, |v, &b| v * 10 + (b - b'0') as u32);
    Some((value, 2 + n))
}

/// RFC 5424's VERSION and the space after it: `[1-9]\d? `.
fn version(rest: &[u8]) -> bool {
    match rest {
        [a, b' ', ..] if (b'1'..=b'9').contains(a) => true,
        [a, d, b' ', ..] if (b'1'..=b'9').contains(a) && digit(*d) => true,
        _ => false,
    }
}

fn dash_is_nil(s: &[u8]) -> Option<&[u8]> {
    if s == b"-" { None } else { Some(s) }
}

fn rfc5424(rest: &[u8]) -> Option<Fields<'_>> {
    let mut parts = rest.splitn(7, |&b| b == b' ');
    let _version = parts.next()?;
    let stamp = parts.next()?;
    let host = parts.next()?;
    let app = parts.next()?;
    let procid = parts.next()?;
    let msgid = parts.next()?;
    let tail = parts.next()?;
    if stamp != b"-" && !rfc3339(stamp, false) {
        return None;
    }
    let (sd, message) = structured_data(tail)?;
    Some(Fields { timestamp: if stamp == b"-" { Stamp::None } else { Stamp::Given(stamp) },
                  host: dash_is_nil(host), app: dash_is_nil(app), procid: dash_is_nil(procid),
                  msgid: dash_is_nil(msgid), sd: Some(sd), message, is_5424: true })
}

/// An RFC 3339 time as RFC 5424 takes it: `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?` then `Z`
/// or `[+-]\d\d:\d\d`, and nothing after (`lower_z`: a `z` too).
fn rfc3339(s: &[u8], lower_z: bool) -> bool {
    rfc3339_len(s, lower_z) == Some(s.len())
}

/// The length of the RFC 3339 time at the start of `s`, if one is there.
fn rfc3339_len(s: &[u8], lower_z: bool) -> Option<usize> {
    let shape = b"dddd-dd-ddTdd:dd:dd";
    if s.len() < shape.len() {
        return None;
    }
    for (&b, &want) in s.iter().zip(shape.iter()) {
        let ok = if want == b'd' { digit(b) } else { b == want };
        if !ok {
            return None;
        }
    }
    let mut at = shape.len();
    if s.get(at) == Some(&b'.') {
        let n = s[at + 1..].iter().take(10).take_while(|&&b| digit(b)).count();
        if n == 0 || n > 9 {
            return None;
        }
        at += 1 + n;
    }
    match s.get(at) {
        Some(b'Z') => Some(at + 1),
        Some(b'z') if lower_z => Some(at + 1),
        Some(b'+') | Some(b'-') => {
            let z = s.get(at + 1..at + 6)?;
            if digit(z[0]) && digit(z[1]) && z[2] == b':' && digit(z[3]) && digit(z[4]) {
                Some(at + 6)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// STRUCTURED-DATA (`-` or `[id k="v" ...]...`) and the message after it; None where the
/// Python parse finds it unparsable, or where an id is given twice (left to it).
fn structured_data(tail: &[u8]) -> Option<(Vec<Element<'_>>, &[u8])> {
    if tail.first() == Some(&b'-') {
        if tail.len() > 1 && tail[1] != b' ' {
            return None;
        }
        return Some((Vec::new(), tail.get(2..).unwrap_or(b"")));
    }
    let mut sd: Vec<Element<'_>> = Vec::new();
    let mut at = 0;
    while at < tail.len() && tail[at] == b'[' {
        let mut end_id = at + 1;
        while end_id < tail.len() && tail[end_id] != b' ' && tail[end_id] != b']' {
            end_id += 1;
        }
        let id = &tail[at + 1..end_id];
        if id.is_empty() || end_id == tail.len() {
            return None;
        }
        if sd.iter().any(|(seen, _)| *seen == id) {
            return None;
        }
        let mut params: Vec<(&[u8], Vec<Vec<u8>>)> = Vec::new();
        at = end_id;
        while let Some((name, value, end)) = param(tail, at) {
            match params.iter_mut().find(|(seen, _)| *seen == name) {
                Some((_, values)) => values.push(value),
                None => params.push((name, vec![value])),
            }
            at = end;
        }
        if at >= tail.len() || tail[at] != b']' {
            return None;
        }
        sd.push((id, params));
        at += 1;
    }
    if at == 0 {
        return None;
    }
    if at < tail.len() && tail[at] != b' ' {
        return None;
    }
    Some((sd, tail.get(at + 1..).unwrap_or(b"")))
}

/// ` NAME="VALUE"` at `at`: the name (1-32 bytes, none of ` ="]`), the value with `\"`, `\\`
/// and `\]` made the byte they escape, and where the parameter ends.
fn param(tail: &[u8], at: usize) -> Option<(&[u8], Vec<u8>, usize)> {
    if tail.get(at) != Some(&b' ') {
        return None;
    }
    let start = at + 1;
    let n = tail[start..].iter().take_while(|&&b| !matches!(b, b' ' | b'=' | b'"' | b']'))
        .count();
    if n == 0 || n > 32 {
        return None;
    }
    let name = &tail[start..start + n];
    let mut i = start + n;
    if tail.get(i..i + 2) != Some(b"=\"") {
        return None;
    }
    i += 2;
    let mut value = Vec::new();
    loop {
        match *tail.get(i)? {
            b'"' => return Some((name, value, i + 1)),
            b']' => return None,
            b'\\' => {
                let next = *tail.get(i + 1)?;
                if !matches!(next, b'"' | b'\\' | b']') {
                    value.push(b'\\');
                }
                value.push(next);
                i += 2;
            }
            b => {
                value.push(b);
                i += 1;
            }
        }
    }
}

fn rfc3164<'a>(rest: &'a [u8], clock: &Clock) -> Option<Fields<'a>> {
    let mut rest = rest;
    let mut stamp = Stamp::None;
    let mut matched = false;
    if let Some(t) = bsd_time(rest) {
        matched = true;
        stamp = match clock.resolve(&t) {
            Resolved::At(s) => Stamp::Made(s),
            Resolved::Nothing => Stamp::None,
            Resolved::Unsure => return None,
        };
        rest = &rest[16..];
    } else if let Some(n) = rfc3339_len(rest, true) {
        if rest.get(n) == Some(&b' ') {
            matched = true;
            stamp = Stamp::Given(&rest[..n]);     // a `z` is made `Z` below
            rest = &rest[n + 1..];
        }
    }
    if let Stamp::Given(s) = stamp {
        if s.contains(&b'z') {
            let mut upper = s.to_vec();
            for b in upper.iter_mut() {
                if *b == b'z' {
                    *b = b'Z';
                }
            }
            stamp = Stamp::Made(String::from_utf8(upper).ok()?);
        }
    }
    let mut host = None;
    let (first, after) = match rest.iter().position(|&b| b == b' ') {
        Some(p) => (&rest[..p], &rest[p + 1..]),
        None => (rest, &b""[..]),
    };
    let tag = if matched && !first.is_empty() && !after.is_empty() && !first.ends_with(b":") {
        host = Some(first);
        rest = after;
        tag(rest, false).or_else(|| tag(rest, true))
    } else {
        tag(rest, false)
    };
    let (mut app, mut procid) = (None, None);
    if let Some((name, pid, end)) = tag {
        app = Some(name);
        procid = pid.filter(|p| !p.is_empty());
        rest = &rest[end..];
    }
    Some(Fields { timestamp: stamp, host, app, procid, msgid: None, sd: None, message: rest,
                  is_5424: false })
}

/// The tag at the start of `s`: `NAME[PID]: ` (the colon, then an optional space) or, `bare`,
/// `NAME[PID] ` (a space); NAME 1-48 bytes, none of space, `[`, `]`, `:`; PID up to 128, none
/// of `]` and space. Its name, its pid and where it ends.
fn tag(s: &[u8], bare: bool) -> Option<(&[u8], Option<&[u8]>, usize)> {
    let n = s.iter().take_while(|&&b| !matches!(b, b' ' | b'[' | b']' | b':')).count();
    if n == 0 || n > 48 {
        return None;
    }
    let name = &s[..n];
    let mut at = n;
    let mut pid = None;
    if s.get(at) == Some(&b'[') {
        let p = s[at + 1..].iter().take_while(|&&b| b != b']' && b != b' ').count();
        if p <= 128 && s.get(at + 1 + p) == Some(&b']') {
            pid = Some(&s[at + 1..at + 1 + p]);
            at += 2 + p;
        }
    }
    if bare {
        if s.get(at) != Some(&b' ') {
            return None;
        }
        return Some((name, pid, at + 1));
    }
    if s.get(at) != Some(&b':') {
        return None;
    }
    at += 1;
    if s.get(at) == Some(&b' ') {
        at += 1;
    }
    Some((name, pid, at))
}

struct BsdTime {
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

/// RFC 3164's `Mmm dd hh:mm:ss ` (the day may start with a space).
fn bsd_time(s: &[u8]) -> Option<BsdTime> {
    let s = s.get(..16)?;
    let month = MONTHS.iter().position(|&m| m == &s[..3])? as u32 + 1;
    let two = |i: usize| -> Option<u32> {
        if digit(s[i]) && digit(s[i + 1]) {
            Some(((s[i] - b'0') * 10 + (s[i + 1] - b'0')) as u32)
        } else {
            None
        }
    };
    if s[3] != b' ' || s[6] != b' ' || s[9] != b':' || s[12] != b':' || s[15] != b' ' {
        return None;
    }
    if !(s[4] == b' ' || digit(s[4])) || !digit(s[5]) {
        return None;
    }
    let day = if s[4] == b' ' { 0 } else { (s[4] - b'0') as u32 * 10 } + (s[5] - b'0') as u32;
    Some(BsdTime { month, day, hour: two(7)?, minute: two(10)?, second: two(13)? })
}

enum Resolved {
    At(String),
    Nothing,
    Unsure,
}

/// The receiver's time and zone, which an RFC 3164 time (no year, no zone) is read in.
struct Clock {
    local_us: i64,      // the receiver's wall time in its zone, µs since 1970-01-01T00:00
    year: i64,
    offset: String,     // `+hh:mm`
}

impl Clock {
    fn new(now_us: i64, offset_s: i32) -> Clock {
        let local_us = now_us + offset_s as i64 * 1_000_000;
        let (year, _, _) = civil(local_us.div_euclid(86_400_000_000));
        let sign = if offset_s < 0 { '-' } else { '+' };
        let a = offset_s.unsigned_abs();
        Clock { local_us, year, offset: format!("{sign}{:02}:{:02}", a / 3600, a % 3600 / 60) }
    }

    /// This year's time, or last year's when this year's would lie more than a day ahead;
    /// nothing when neither is a date (as Python's `datetime` judges it).
    fn resolve(&self, t: &BsdTime) -> Resolved {
        if self.year <= 1 || self.year > 9999 {
            return Resolved::Unsure;
        }
        for year in [self.year, self.year - 1] {
            if t.day < 1 || t.day > days_in(year, t.month) || t.hour > 23 || t.minute > 59
                || t.second > 59 {
                continue;
            }
            let days = days_from_civil(year, t.month, t.day);
            let at_us = (days * 86_400 + (t.hour * 3600 + t.minute * 60 + t.second) as i64)
                * 1_000_000;
            if at_us - self.local_us <= 86_400_000_000 {
                return Resolved::At(format!("{year:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}", t.month,
                                            t.day, t.hour, t.minute, t.second, self.offset));
            }
        }
        Resolved::Nothing
    }
}

fn leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in(y: i64, m: u32) -> u32 {
    match m {
        2 => if leap(y) { 29 } else { 28 },
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day since 1970-01-01.
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + if m <= 2 { 1 } else { 0 }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_trip() {
        for z in [-800_000i64, -1, 0, 1, 365, 10_957, 20_000, 2_932_896] {
            let (y, m, d) = civil(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }
}
