//! docket's native send path: the records of a sealed slot produced to Kafka from native code,
//! their delivery reports counted per slot without a Python call per record.
//!
//! Python hands over a block of a slot at a time, as the pool frames it: the payload, each
//! record's offset, length and timestamp, its record number (the `docket-seq` header), and the
//! headers every record of the block shares. The loop over the records runs with the GIL
//! released. Each record travels with an opaque of (slot token << 32 | record index); its
//! delivery report, served by `poll`, counts an acknowledgement, or a failure that `poll`
//! hands back at once by its index (the drain decides what becomes of it while the slot goes
//! on). Once Python has said how many records a slot holds (`seal`) and that many reports are
//! in, the slot is done: `poll` returns (token, acknowledged, failed, prefix) once for it. Until then
//! `acked_prefix` says how many of its records, from the first on, are acknowledged (the drain
//! keeps that in the slot's header: a start after a crash sends the slot from there).
//!
//! Beside it, the sources' per-record work that Python would do a call at a time: the journald
//! source's export format (`journal.rs`), the syslog source's JSON (`syslog.rs`), a multiline
//! rule's lines (`lines.rs`), the audit's value hashes (`value_hashes`).

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::bindings as rdsys;
use rdkafka::bindings::rd_kafka_resp_err_t as RespErr;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext, PurgeConfig};
use rdkafka::ClientContext;

mod journal;
mod lines;
mod syslog;
mod tally;

/// librdkafka's code for an error that is not a broker's or the client's own (none known).
const UNKNOWN_ERROR: i32 = -1;
/// The header that carries each record's number.
const SEQ_HEADER: &str = "docket-seq";
/// At most this many events are served by one `poll` before it returns.
const POLL_MAX_EVENTS: usize = 100_000;
/// At most this many of librdkafka's log lines wait for a `poll` to hand them to Python; more
/// are counted, not kept (a `debug` setting under an outage writes thousands a second).
const LOGS_KEPT: usize = 10_000;
/// How long `flush` waits for one report before it looks whether librdkafka's flush is over.
const FLUSH_SERVE_WAIT: Duration = Duration::from_millis(10);

#[derive(Default)]
struct SlotReports {
    total: Option<u64>,
    acked: u64,
    failed: u64,
    prefix: u64,          // records acknowledged from index 0 (or from where the send began) on
    seen: Vec<u64>,       // a bit per record index acknowledged, for the prefix to pass over
}

impl SlotReports {
    fn complete(&self) -> bool {
        self.total == Some(self.acked + self.failed)
    }

    /// Record `index` acknowledged: the prefix moves over every acknowledged index after it.
    fn ack(&mut self, index: u64) {
        self.acked += 1;
        if index < self.prefix {
            return;
        }
        let word = (index / 64) as usize;
        if self.seen.len() <= word {
            self.seen.resize(word + 1, 0);
        }
        self.seen[word] |= 1 << (index % 64);
        loop {
            let (w, b) = ((self.prefix / 64) as usize, self.prefix % 64);
            match self.seen.get(w) {
                Some(&bits) if b == 0 && bits == u64::MAX => self.prefix += 64,
                Some(&bits) if bits >> b & 1 == 1 => self.prefix += 1,
                _ => break,
            }
        }
    }
}

/// A record that failed: (slot token, its index in the slot, librdkafka's error code, whether
/// `produce` refused it before it was queued — then the error is about this record alone,
/// never about a batch it travelled in).
type Failure = (u32, u64, i32, bool);

/// A slot done: (token, acknowledged, failed, acknowledged from the first record on).
type Done = (u32, u64, u64, u64);

#[derive(Default)]
struct Ledger {
    slots: HashMap<u32, SlotReports>,
    done: Vec<Done>,
    failures: Vec<Failure>,
    errors: Vec<(i32, String)>,        // the client's error events, for the drain's handler
    logs: Vec<LogLine>,                // librdkafka's log lines, for the agent's log
    logs_dropped: u64,                 // ... beyond LOGS_KEPT since the last poll
    reports: u64,
    events: u64,                       // reports, errors and log lines: what `poll` serves
}

/// One of librdkafka's log lines: (syslog level, facility, message).
type LogLine = (i32, String, String);

impl Ledger {
    /// Something `poll` hands back: a failure, a slot done, an error or a log line.
    fn news(&self) -> bool {
        !self.failures.is_empty() || !self.done.is_empty() || !self.errors.is_empty()
            || !self.logs.is_empty() || self.logs_dropped > 0
    }


    fn count(&mut self, token: u32, index: u64, failure: Option<(i32, bool)>) {
        self.reports += 1;
        self.events += 1;
        let slot = self.slots.entry(token).or_default();
        match failure {
            None => slot.ack(index),
            Some((code, refused)) => {
                slot.failed += 1;
                self.failures.push((token, index, code, refused));
            }
        }
        self.settle(token);
    }

    fn settle(&mut self, token: u32) {
        if self.slots.get(&token).is_some_and(SlotReports::complete) {
            let s = self.slots.remove(&token).expect("a slot just looked at");
            self.done.push((token, s.acked, s.failed, s.prefix));
        }
    }
}

struct Reports {
    ledger: Mutex<Ledger>,
}

impl ClientContext for Reports {
    fn error(&self, error: KafkaError, reason: &str) {
        let mut ledger = self.ledger.lock().expect("the ledger's lock");
        ledger.events += 1;
        ledger.errors.push((error_code(&error), reason.to_string()));
    }

    /// librdkafka's log lines (from its own threads) wait for the next `poll`, which hands
    /// them to the agent's logger, as confluent-kafka does for the Python path's client.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let mut ledger = self.ledger.lock().expect("the ledger's lock");
        ledger.events += 1;
        if ledger.logs.len() < LOGS_KEPT {
            ledger.logs.push((level as i32, fac.to_string(), message.to_string()));
        } else {
            ledger.logs_dropped += 1;
        }
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let token = (opaque >> 32) as u32;
        let index = (opaque & 0xffff_ffff) as u64;
        let failure = match result {
            Ok(_) => None,
            Err((err, _)) => Some((error_code(err), false)),
        };
        self.ledger.lock().expect("the ledger's lock").count(token, index, failure);
    }
}

/// Add a header to `h`, a list of our own not yet handed to a message; librdkafka copies the
/// name and the value.
fn add_header(h: *mut rdsys::rd_kafka_headers_t, name: &str, value: &[u8]) {
    // SAFETY: a valid, writable list; both slices live through the call.
    unsafe {
        rdsys::rd_kafka_header_add(h, name.as_ptr() as *const c_char, name.len() as isize,
                                   value.as_ptr() as *const c_void, value.len() as isize);
    }
}

fn error_code(err: &KafkaError) -> i32 {
    err.rdkafka_error_code().map_or(UNKNOWN_ERROR, |c| c as i32)
}

fn contiguous<T: pyo3::buffer::Element>(obj: &Bound<'_, PyAny>, what: &str)
                                        -> PyResult<PyBuffer<T>> {
    let buf = PyBuffer::<T>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what}: a contiguous buffer is needed")));
    }
    Ok(buf)
}

/// `contiguous`, and writable: a buffer the call fills.
fn writable<T: pyo3::buffer::Element>(obj: &Bound<'_, PyAny>, what: &str)
                                      -> PyResult<PyBuffer<T>> {
    let buf = contiguous::<T>(obj, what)?;
    if buf.readonly() {
        return Err(PyValueError::new_err(format!("{what}: a writable buffer is needed")));
    }
    Ok(buf)
}

/// The buffer's items as a slice. The caller keeps `buf` (and so the export) alive while the
/// slice is used, and the memory is a sealed slot's, a fresh array's or immutable bytes':
/// nobody writes it meanwhile.
unsafe fn items<T: pyo3::buffer::Element>(buf: &PyBuffer<T>) -> &[T] {
    if buf.item_count() == 0 {
        return &[];
    }
    std::slice::from_raw_parts(buf.buf_ptr() as *const T, buf.item_count())
}

/// A transaction call's error: (code, text, fatal, retriable, requires abort).
type TxnError = (i32, String, bool, bool, bool);

/// The client handle, to be used from a thread without the GIL (librdkafka's calls on it
/// are thread-safe; the producer outlives the call: the Python object holds it).
#[derive(Clone, Copy)]
struct Handle(usize);

impl Handle {
    fn get(self) -> *mut rdsys::rd_kafka_t {
        self.0 as *mut rdsys::rd_kafka_t
    }
}

/// Seconds as librdkafka's milliseconds (a negative wait is none).
fn millis(timeout_s: f64) -> i32 {
    (timeout_s.max(0.0) * 1000.0).min(i32::MAX as f64) as i32
}

/// A transaction call's `rd_kafka_error_t` read and freed: None where it is no error.
fn txn_outcome(err: *mut rdsys::rd_kafka_error_t) -> Option<TxnError> {
    if err.is_null() {
        return None;
    }
    // SAFETY: a valid error object that this function owns and destroys once.
    unsafe {
        let code = rdsys::rd_kafka_error_code(err) as i32;
        let text = std::ffi::CStr::from_ptr(rdsys::rd_kafka_error_string(err))
            .to_string_lossy().into_owned();
        let outcome = (code, text, rdsys::rd_kafka_error_is_fatal(err) != 0,
                       rdsys::rd_kafka_error_is_retriable(err) != 0,
                       rdsys::rd_kafka_error_txn_requires_abort(err) != 0);
        rdsys::rd_kafka_error_destroy(err);
        Some(outcome)
    }
}

/// A Kafka producer whose delivery reports are counted per slot.
#[pyclass(module = "docket_native")]
struct SlotProducer {
    /// Dropped before the producer (`Drop` below), while the client still lives.
    wake: ManuallyDrop<Wake>,
    producer: ManuallyDrop<BaseProducer<Reports>>,
}

impl Drop for SlotProducer {
    /// Without the GIL: the crate's drop of a producer flushes for up to 500 ms and
    /// librdkafka's destroy waits for its threads, and a replaced producer is let go of from
    /// a thread of the agent's (`drain/transact.py`, `let_go`) while its loop goes on.
    fn drop(&mut self) {
        // SAFETY: each field is taken once, here, and nothing uses it afterwards.
        let (wake, producer) = unsafe {
            (ManuallyDrop::take(&mut self.wake), ManuallyDrop::take(&mut self.producer))
        };
        Python::attach(|py| py.detach(move || {
            drop(wake);
            drop(producer);
        }));
    }
}

/// The pipe a waiting `poll` sleeps on: librdkafka writes a byte to it when its main queue
/// (delivery reports, errors) goes from empty to not empty (`rd_kafka_queue_io_event_enable`).
/// The crate's own poll cannot wait for an event: it waits out its whole timeout, and a
/// timeout under a millisecond turns into a busy loop (librdkafka's queue poll takes whole
/// milliseconds): an idle agent spent half a core in it.
struct Wake {
    queue: *mut rdkafka::bindings::rd_kafka_queue_t,
    read: libc::c_int,
    write: libc::c_int,
}

// SAFETY: librdkafka's queues may be used from any thread; the descriptors are plain numbers.
unsafe impl Send for Wake {}
unsafe impl Sync for Wake {}

impl Wake {
    fn new(producer: &BaseProducer<Reports>) -> PyResult<Self> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(PyValueError::new_err(format!(
                "cannot create the producer's wake-up pipe: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: the client pointer is valid while `producer` lives, and the queue reference
        // taken here is released (Drop) before the producer is destroyed.
        let queue = unsafe {
            rdkafka::bindings::rd_kafka_queue_get_main(producer.client().native_ptr())
        };
        // SAFETY: a valid queue; the write end stays open until Drop has turned this off.
        unsafe {
            rdkafka::bindings::rd_kafka_queue_io_event_enable(
                queue, fds[1], b"1".as_ptr() as *const libc::c_void, 1);
        }
        Ok(Wake { queue, read: fds[0], write: fds[1] })
    }

    /// Events waiting in the queue (one served may leave others: no byte comes for them).
    fn waiting(&self) -> bool {
        // SAFETY: a valid queue reference, this struct's own.
        unsafe { rdkafka::bindings::rd_kafka_queue_length(self.queue) > 0 }
    }

    /// Sleep until librdkafka writes, `other` (the caller's descriptor, -1 for none) becomes
    /// readable or `timeout` passes, then empty the pipe. `other` is left for its owner to
    /// read; true when it is readable.
    fn wait(&self, timeout: Duration, other: libc::c_int) -> bool {
        let mut fds = [libc::pollfd { fd: self.read, events: libc::POLLIN, revents: 0 },
                       libc::pollfd { fd: other, events: libc::POLLIN, revents: 0 }];
        let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t,
                                  tv_nsec: timeout.subsec_nanos() as libc::c_long };
        let count: libc::nfds_t = if other >= 0 { 2 } else { 1 };
        // SAFETY: `count` valid pollfds; a null signal mask leaves the thread's mask as it is.
        unsafe { libc::ppoll(fds.as_mut_ptr(), count, &ts, std::ptr::null()) };
        let mut buf = [0u8; 64];
        // SAFETY: reads into a local buffer from a non-blocking descriptor this struct owns.
        while unsafe { libc::read(self.read, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) }
            > 0 {}
        other >= 0 && fds[1].revents != 0
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        // SAFETY: the producer still lives (SlotProducer drops this first): librdkafka stops
        // writing before the descriptors are closed, the queue reference is released once.
        unsafe {
            rdkafka::bindings::rd_kafka_queue_io_event_enable(self.queue, -1,
                                                              std::ptr::null(), 0);
            rdkafka::bindings::rd_kafka_queue_destroy(self.queue);
            libc::close(self.read);
            libc::close(self.write);
        }
    }
}

impl SlotProducer {
    fn rk(&self) -> Handle {
        Handle(self.producer.client().native_ptr() as usize)
    }
}

#[pymethods]
impl SlotProducer {
    /// `config`: librdkafka properties (the agent's producer settings). Delivery reports are
    /// turned on for every record: they are counted here, not in Python.
    #[new]
    fn new(config: HashMap<String, String>) -> PyResult<Self> {
        let mut conf = ClientConfig::new();
        for (k, v) in &config {
            conf.set(k, v);
        }
        conf.set("delivery.report.only.error", "false");
        // librdkafka's own lines from Info up (Debug with a `debug` setting), as the Python
        // client logs them; the crate's default follows Rust's logger, which nobody set here.
        conf.set_log_level(if config.contains_key("debug") { RDKafkaLogLevel::Debug }
                           else { RDKafkaLogLevel::Info });
        let reports = Reports { ledger: Mutex::new(Ledger::default()) };
        let producer: BaseProducer<Reports> = conf
            .create_with_context(reports)
            .map_err(|e| PyValueError::new_err(format!("cannot create the producer: {e}")))?;
        let wake = Wake::new(&producer)?;
        Ok(SlotProducer { wake: ManuallyDrop::new(wake), producer: ManuallyDrop::new(producer) })
    }

    /// Produce records [start, n) of one block of slot `token`, with the GIL released; returns
    /// how many were handed to librdkafka (fewer than asked when its queue is full: call
    /// again from there after a `poll`). `first_index`: the slot-wide index of the block's
    /// record 0 (failures are reported by it). `numbers`: each record's number (its
    /// `docket-seq` header, 8 bytes big-endian), or None. `keys`: a list of bytes or None per
    /// record, or None. `indices`: each record's slot-wide index (int64), for records that are
    /// not consecutive in the slot (those sent again after a failure); then `first_index` is
    /// not used.
    #[pyo3(signature = (token, first_index, topic, payload, offsets, lengths, timestamps,
                        headers, numbers, keys, start, indices = None))]
    #[allow(clippy::too_many_arguments)]
    fn send(&self, py: Python<'_>, token: u32, first_index: u64, topic: &str,
            payload: &Bound<'_, PyAny>, offsets: &Bound<'_, PyAny>,
            lengths: &Bound<'_, PyAny>, timestamps: &Bound<'_, PyAny>,
            headers: Vec<(String, Vec<u8>)>, numbers: Option<&Bound<'_, PyAny>>,
            keys: Option<&Bound<'_, PyList>>, start: usize,
            indices: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let payload = contiguous::<u8>(payload, "payload")?;
        let offsets = contiguous::<i64>(offsets, "offsets")?;
        let lengths = contiguous::<i64>(lengths, "lengths")?;
        let timestamps = contiguous::<i64>(timestamps, "timestamps")?;
        let numbers = numbers.map(|n| contiguous::<i64>(n, "numbers")).transpose()?;
        let indices = indices.map(|i| contiguous::<i64>(i, "indices")).transpose()?;
        let n = offsets.item_count();
        if lengths.item_count() != n || timestamps.item_count() != n
            || numbers.as_ref().is_some_and(|b| b.item_count() != n)
            || indices.as_ref().is_some_and(|b| b.item_count() != n) {
            return Err(PyValueError::new_err("offsets, lengths, timestamps, numbers and \
                                              indices must have one item per record"));
        }
        // Safety: the buffer lives until this function returns; the array is the caller's.
        let idx = indices.as_ref().map(|b| unsafe { items(b) });
        let index_of = |i: usize| -> u64 {
            idx.map_or(first_index + i as u64, |v| v[i] as u64)
        };
        let in_range = match idx {
            Some(v) => v.iter().all(|&x| (0..=u32::MAX as i64).contains(&x)),
            None => first_index + n as u64 <= u32::MAX as u64 + 1,
        };
        if !in_range {
            return Err(PyValueError::new_err("a slot's record index must fit in 32 bits"));
        }
        let keys: Option<Vec<Option<Vec<u8>>>> = match keys {
            None => None,
            Some(list) if list.len() == n => Some(list.extract()?),
            Some(_) => return Err(PyValueError::new_err("keys: one item per record")),
        };
        // Safety: the buffers live until this function returns; a sealed slot is not
        // written while it is sent, and the arrays are the caller's own.
        let (data, offs, lens, ts) =
            unsafe { (items(&payload), items(&offsets), items(&lengths), items(&timestamps)) };
        let nums = numbers.as_ref().map(|b| unsafe { items(b) });
        for i in start.min(n)..n {
            let (o, l) = (offs[i], lens[i]);
            if o < 0 || l < 0 || (o + l) as usize > data.len() {
                return Err(PyValueError::new_err(format!("record {i} lies outside the payload")));
            }
        }
        let producer = &self.producer;
        let topic_c = CString::new(topic);
        py.detach(|| {
            // One topic handle for the block (librdkafka's, looked up or made once here):
            // naming the topic on every record would look it up and copy its name each time.
            let rk = producer.client().native_ptr();
            let rkt = match &topic_c {
                // SAFETY: a valid client and a NUL-terminated name; a null conf means the
                // client's default topic configuration, as a record naming its topic gets.
                Ok(name) => unsafe {
                    rdsys::rd_kafka_topic_new(rk, name.as_ptr(), ptr::null_mut())
                },
                Err(_) => ptr::null_mut(),
            };
            if rkt.is_null() {
                // No handle (a name librdkafka refuses): every record is refused, as it would
                // be one by one.
                let code = if topic_c.is_ok() {
                    // SAFETY: reads the calling thread's last error.
                    unsafe { rdsys::rd_kafka_last_error() as i32 }
                } else {
                    UNKNOWN_ERROR
                };
                let mut ledger = producer.context().ledger.lock().expect("the ledger's lock");
                for i in start.min(n)..n {
                    ledger.count(token, index_of(i), Some((code, true)));
                }
                return Ok(n.max(start));
            }
            let mut i = start;
            while i < n {
                // SAFETY: a fresh header list; the message owns it once produced.
                let h = unsafe { rdsys::rd_kafka_headers_new(headers.len() + 1) };
                for (name, value) in &headers {
                    add_header(h, name, value);
                }
                if let Some(nums) = nums {
                    add_header(h, SEQ_HEADER, &(nums[i] as u64).to_be_bytes());
                }
                let opaque = ((token as usize) << 32) | index_of(i) as usize;
                let (o, l) = (offs[i] as usize, lens[i] as usize);
                let (key_ptr, key_len) = match keys.as_ref().map(|k| &k[i]) {
                    Some(Some(key)) => (key.as_ptr() as *mut c_void, key.len()),
                    _ => (ptr::null_mut(), 0),
                };
                // SAFETY: the handle and every pointer are valid for the call; the payload is
                // copied (F_COPY); on success librdkafka owns the headers, on failure we do.
                let err = unsafe {
                    rdsys::rd_kafka_producev(
                        rk,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_RKT, rkt,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION, -1i32,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                        rdsys::RD_KAFKA_MSG_F_COPY,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                        data[o..o + l].as_ptr() as *mut c_void, l,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY, key_ptr, key_len,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_OPAQUE, opaque as *mut c_void,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TIMESTAMP, ts[i],
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS, h,
                        rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_END)
                };
                if err == RespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                    i += 1;
                    continue;
                }
                // SAFETY: not produced: the headers are still ours.
                unsafe { rdsys::rd_kafka_headers_destroy(h) };
                if err == RespErr::RD_KAFKA_RESP_ERR__QUEUE_FULL {
                    break;
                }
                // Refused before it was queued (too large for the client, unknown partition):
                // reported as a failure of this record at once.
                producer.context().ledger.lock().expect("the ledger's lock")
                    .count(token, index_of(i), Some((err as i32, true)));
                i += 1;
            }
            // SAFETY: the handle taken above, released once; queued records hold their own.
            unsafe { rdsys::rd_kafka_topic_destroy(rkt) };
            Ok(i)
        })
    }

    /// Slot `token` holds `total` records, all sent: it is done once that many are reported.
    fn seal(&self, token: u32, total: u64) {
        let mut ledger = self.producer.context().ledger.lock().expect("the ledger's lock");
        ledger.slots.entry(token).or_default().total = Some(total);
        ledger.settle(token);
    }

    /// Serve every delivery report waiting, and wait up to `timeout_s` (GIL released) while
    /// none of them is news to the caller; returns what happened since the last call, each
    /// once: the failures, [(token, record index, error code, refused by produce)], the slots
    /// done, [(token, acknowledged, failed, acknowledged prefix)], the client's errors, [(code,
    /// reason)], and librdkafka's log lines, [(syslog level, facility, message)] (with one
    /// more saying how many were not kept, when more than `LOGS_KEPT` came). A report that
    /// only counts an acknowledgement of a slot not yet done is no news: it does not end the
    /// wait (a slot sent while it fills is acknowledged record by record, and waking the
    /// caller for each was a turn of its loop per line). `wake_fd`: a descriptor of the
    /// caller's (the agent's file-write watch) that ends the wait too when it becomes
    /// readable; the caller reads it.
    #[pyo3(signature = (timeout_s, wake_fd = -1))]
    fn poll(&self, py: Python<'_>, timeout_s: f64, wake_fd: i32)
            -> (Vec<Failure>, Vec<Done>, Vec<(i32, String)>, Vec<LogLine>) {
        let producer = &self.producer;
        // Reports, errors and log lines alike: each served is progress through the queue (the
        // reports behind a log line must not wait for one line a call).
        let served = || producer.context().ledger.lock().expect("the ledger's lock").events;
        let news = || producer.context().ledger.lock().expect("the ledger's lock").news();
        let wake = &self.wake;
        py.detach(|| {
            // Serve every event waiting (the crate's poll with no timeout serves at most one);
            // with no news yet, sleep on the wake-up pipe until more comes or time is up.
            let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
            for _ in 0..POLL_MAX_EVENTS {
                let before = served();
                producer.poll(Duration::ZERO);
                if served() == before {
                    let now = Instant::now();
                    if news() || now >= deadline {
                        break;
                    }
                    if !wake.waiting() && wake.wait(deadline - now, wake_fd) {
                        break;                  // the caller's descriptor: its turn
                    }
                }
            }
        });
        let mut ledger = producer.context().ledger.lock().expect("the ledger's lock");
        let mut logs = std::mem::take(&mut ledger.logs);
        if ledger.logs_dropped > 0 {
            logs.push((RDKafkaLogLevel::Warning as i32, "LOGS".to_string(), format!(
                "{} log line(s) of librdkafka not kept (more than {LOGS_KEPT} between two polls)",
                std::mem::take(&mut ledger.logs_dropped))));
        }
        (std::mem::take(&mut ledger.failures), std::mem::take(&mut ledger.done),
         std::mem::take(&mut ledger.errors), logs)
    }

    /// Slot `token`'s records before index `first` count as acknowledged (a send that begins
    /// there: they were acknowledged before it); call before its first record is sent.
    fn begin(&self, token: u32, first: u64) {
        let mut ledger = self.producer.context().ledger.lock().expect("the ledger's lock");
        ledger.slots.entry(token).or_default().prefix = first;
    }

    /// How many of slot `token`'s records, from the first on, are acknowledged (0 once it is
    /// done and handed back: its `poll` result says the rest).
    fn acked_prefix(&self, token: u32) -> u64 {
        let ledger = self.producer.context().ledger.lock().expect("the ledger's lock");
        ledger.slots.get(&token).map_or(0, |s| s.prefix)
    }

    /// Reports counted so far for slot `token` (0 once it is done and handed back).
    fn reported(&self, token: u32) -> u64 {
        let ledger = self.producer.context().ledger.lock().expect("the ledger's lock");
        ledger.slots.get(&token).map_or(0, |s| s.acked + s.failed)
    }

    /// The client's name, as librdkafka names it in its log lines (`client.id#producer-N`).
    fn name(&self) -> String {
        // SAFETY: a valid client; librdkafka returns its own NUL-terminated name, which lives
        // as long as the client and is copied here.
        unsafe { std::ffi::CStr::from_ptr(rdsys::rd_kafka_name(self.producer.client().native_ptr())) }
            .to_string_lossy().into_owned()
    }

    /// Delivery reports served so far (the drain's outage guard watches it move).
    fn reports(&self) -> u64 {
        self.producer.context().ledger.lock().expect("the ledger's lock").reports
    }

    /// Records handed over and not yet reported.
    fn __len__(&self) -> usize {
        self.producer.in_flight_count().max(0) as usize
    }

    /// Take back the records still queued in librdkafka, and with `in_flight` those sent and
    /// not yet answered: each comes back as a failure with librdkafka's purge code.
    #[pyo3(signature = (in_flight=false))]
    fn purge(&self, in_flight: bool) {
        let how = PurgeConfig::default().queue();
        self.producer.purge(if in_flight { how.inflight() } else { how });
    }

    /// Transactions (`broker.delivery = "exactly_once"`, `agent/drain/native_txn.py`): each
    /// call waits for the cluster up to `timeout_s` with the GIL released (the drain makes
    /// these calls from a thread of its own) and returns None, or librdkafka's error as
    /// (code, text, fatal, retriable, requires abort): the Python path's KafkaError, for the
    /// same rules. `init_transactions` fences an earlier producer of the `transactional.id`.
    fn init_transactions(&self, py: Python<'_>, timeout_s: f64) -> Option<TxnError> {
        let (rk, ms) = (self.rk(), millis(timeout_s));
        py.detach(|| txn_outcome(unsafe { rdsys::rd_kafka_init_transactions(rk.get(), ms) }))
    }

    /// Open a transaction (no wait for the cluster).
    fn begin_transaction(&self) -> Option<TxnError> {
        txn_outcome(unsafe { rdsys::rd_kafka_begin_transaction(self.rk().get()) })
    }

    /// Put the offset `offset` with `metadata` on `topic`'s `partition` for consumer group
    /// `group` into the open transaction (Kafka's TxnOffsetCommit): the agent's progress
    /// marker. The group's metadata is its id alone (no member: nothing consumes in it).
    fn send_offsets_to_transaction(&self, py: Python<'_>, topic: &str, partition: i32,
                                   offset: i64, metadata: &str, group: &str, timeout_s: f64)
                                   -> PyResult<Option<TxnError>> {
        let topic_c = CString::new(topic)
            .map_err(|_| PyValueError::new_err("the topic holds a NUL byte"))?;
        let group_c = CString::new(group)
            .map_err(|_| PyValueError::new_err("the group holds a NUL byte"))?;
        let (rk, ms) = (self.rk(), millis(timeout_s));
        let meta = metadata.as_bytes().to_vec();
        Ok(py.detach(move || unsafe {
            // The list owns the metadata and frees it with librdkafka's allocator, which
            // made it. It ends with a NUL, counted in its size, as the Python client writes
            // it: that client reads a committed offset's metadata as a C string (the marker's
            // reader, and the Python path's marker, are confluent-kafka's).
            let copy = rdsys::rd_kafka_mem_malloc(rk.get(), meta.len() + 1) as *mut u8;
            if copy.is_null() {              // a marker without its slots is never committed
                return Some((RespErr::RD_KAFKA_RESP_ERR__FAIL as i32,
                             "no memory for the progress marker".to_string(), false, true,
                             false));
            }
            ptr::copy_nonoverlapping(meta.as_ptr(), copy, meta.len());
            *copy.add(meta.len()) = 0;
            let list = rdsys::rd_kafka_topic_partition_list_new(1);
            let elem = rdsys::rd_kafka_topic_partition_list_add(list, topic_c.as_ptr(),
                                                                partition);
            (*elem).offset = offset;
            (*elem).metadata = copy as *mut c_void;
            (*elem).metadata_size = meta.len() + 1;
            let cgm = rdsys::rd_kafka_consumer_group_metadata_new(group_c.as_ptr());
            let outcome = txn_outcome(rdsys::rd_kafka_send_offsets_to_transaction(
                rk.get(), list, cgm, ms));
            rdsys::rd_kafka_consumer_group_metadata_destroy(cgm);
            rdsys::rd_kafka_topic_partition_list_destroy(list);
            outcome
        }))
    }

    /// Commit the open transaction: librdkafka first sends what is queued and waits for its
    /// reports (which `poll` serves, on the agent's loop, as at any time).
    fn commit_transaction(&self, py: Python<'_>, timeout_s: f64) -> Option<TxnError> {
        let (rk, ms) = (self.rk(), millis(timeout_s));
        py.detach(|| txn_outcome(unsafe { rdsys::rd_kafka_commit_transaction(rk.get(), ms) }))
    }

    /// Abort the open transaction (its records are purged first: see `purge`).
    fn abort_transaction(&self, py: Python<'_>, timeout_s: f64) -> Option<TxnError> {
        let (rk, ms) = (self.rk(), millis(timeout_s));
        py.detach(|| txn_outcome(unsafe { rdsys::rd_kafka_abort_transaction(rk.get(), ms) }))
    }

    /// librdkafka's fatal error, if one happened: (code, text).
    fn fatal_error(&self) -> Option<(i32, String)> {
        self.producer.client().fatal_error().map(|(code, text)| (code as i32, text))
    }

    /// Send what is queued at once, lingering or not, and wait up to `timeout_s` for every
    /// record to be reported (GIL released); whether all were (a timeout is an answer, not an
    /// error: the caller decides).
    ///
    /// librdkafka ignores `linger.ms` only while a `rd_kafka_flush` call is waiting, and
    /// delivers reports as events that the caller serves: so one thread waits in that call
    /// for the whole timeout while this one serves the reports. (The crate's own flush calls
    /// it with no wait, over and over: a broker thread rarely looks in that instant, and the
    /// records lingered for all of `linger.ms`.) A report that panics here (the ledger's lock
    /// poisoned by an earlier panic) leaves that thread to wait out the timeout before the
    /// panic is raised: the agent calls it with none.
    fn flush(&self, py: Python<'_>, timeout_s: f64) -> bool {
        let producer = &self.producer;
        let (rk, timeout_ms) = (self.rk(), millis(timeout_s));
        py.detach(|| std::thread::scope(|scope| {
            let waiter = scope.spawn(move || unsafe {
                rdsys::rd_kafka_flush(rk.get(), timeout_ms)
            });
            while !waiter.is_finished() {
                producer.poll(FLUSH_SERVE_WAIT);
            }
            producer.poll(Duration::ZERO);
            waiter.join().expect("the flush's waiting thread")
                == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        }))
    }
}

/// The audit's value hash (XXH64 with `seed`) of each record of a block, `payload[offsets[i]
/// .. offsets[i] + lengths[i]]` (int64 offsets, uint32 lengths: a block's arrays as it reads
/// them from the slot), written into `out`
/// (uint64, one per record), with the GIL released: the tally's per-record pass without a
/// Python call per record.
#[pyfunction]
fn value_hashes(py: Python<'_>, payload: &Bound<'_, PyAny>, offsets: &Bound<'_, PyAny>,
                lengths: &Bound<'_, PyAny>, seed: u64, out: &Bound<'_, PyAny>)
                -> PyResult<()> {
    let payload = contiguous::<u8>(payload, "payload")?;
    let offsets = contiguous::<i64>(offsets, "offsets")?;
    let lengths = contiguous::<u32>(lengths, "lengths")?;
    let out = writable::<u64>(out, "out")?;
    let n = offsets.item_count();
    if lengths.item_count() != n || out.item_count() != n {
        return Err(PyValueError::new_err(format!(
            "offsets ({n}), lengths ({}) and out ({}) must have one entry per record",
            lengths.item_count(), out.item_count())));
    }
    // SAFETY: the buffers stay exported (held above) while the slices live.
    let (data, offs, lens) = unsafe { (items(&payload), items(&offsets), items(&lengths)) };
    for (i, (&o, &l)) in offs.iter().zip(lens).enumerate() {
        let end = o.saturating_add(l as i64);
        if o < 0 || end as usize > data.len() {
            return Err(PyValueError::new_err(format!(
                "record {i}: bytes {o}..{end} lie outside the payload ({} bytes)", data.len())));
        }
    }
    // SAFETY: `out` is a writable, contiguous buffer of n u64 the caller holds while this
    // runs, and nothing else writes it meanwhile.
    let hashes = unsafe { std::slice::from_raw_parts_mut(out.buf_ptr() as *mut u64, n) };
    py.detach(|| {
        for ((h, &o), &l) in hashes.iter_mut().zip(offs).zip(lens) {
            let start = o as usize;              // every range checked above
            *h = xxhash_rust::xxh64::xxh64(&data[start..start + l as usize], seed);
        }
    });
    Ok(())
}

#[pymodule]
fn docket_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SlotProducer>()?;
    m.add_function(wrap_pyfunction!(value_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(tally::slot_tally, m)?)?;
    m.add_class::<syslog::SyslogJson>()?;
    m.add_class::<journal::JournalExport>()?;
    m.add_class::<lines::LineMatcher>()?;
    m.add("LIBRDKAFKA_VERSION", rdkafka::util::get_rdkafka_version().1)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::SlotReports;

    #[test]
    fn the_prefix_passes_over_every_acknowledged_index_and_stops_at_a_gap() {
        let mut s = SlotReports::default();
        for i in [1, 2, 3, 70, 0] {
            s.ack(i);
        }
        assert_eq!(s.prefix, 4);
        for i in 4..70 {
            s.ack(i);
        }
        assert_eq!(s.prefix, 71);
        for i in (72..300).rev() {
            s.ack(i);
        }
        assert_eq!(s.prefix, 71);            // 71 never acknowledged: a failure, sent again
        s.ack(71);
        assert_eq!((s.prefix, s.acked), (300, 300));
    }

    #[test]
    fn a_send_that_begins_past_acknowledged_records_counts_them() {
        let mut s = SlotReports { prefix: 128, ..Default::default() };
        s.ack(129);
        assert_eq!(s.prefix, 128);
        s.ack(128);
        assert_eq!(s.prefix, 130);
    }
}
