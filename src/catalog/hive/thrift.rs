//! A small Thrift client: the binary protocol (strict message headers, unframed — what the Hive Metastore serves by
//! default) over one TCP connection, with *dynamic* values instead of generated types.
//!
//! Why dynamic: a Metastore `Table` has dozens of fields across Hive versions, and a commit must send back the table
//! it read with two parameters changed. Decoding into a [`Value`] tree that keeps every field it does not know (by id
//! and wire type, in order) and encoding that tree again round-trips any version's table without a generated struct
//! — and without the code generator and its runtime as dependencies.
//!
//! Invariants: a decoded value re-encodes to the same bytes (field order and container element types are kept);
//! lengths read from the wire are bounded ([`MAX_LEN`]) before anything is allocated; a reply whose sequence id or
//! method name does not match the call is a protocol error and the connection is dropped.
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Wire type ids of the binary protocol.
pub(crate) mod ty {
    pub const STOP: u8 = 0;
    pub const BOOL: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const DOUBLE: u8 = 4;
    pub const I16: u8 = 6;
    pub const I32: u8 = 8;
    pub const I64: u8 = 10;
    pub const STRING: u8 = 11;
    pub const STRUCT: u8 = 12;
    pub const MAP: u8 = 13;
    pub const SET: u8 = 14;
    pub const LIST: u8 = 15;
}

const VERSION_1: u32 = 0x8001_0000;
const CALL: u8 = 1;
const REPLY: u8 = 2;
const EXCEPTION: u8 = 3;
/// Upper bound of any length or element count read from the wire (a Metastore table is kilobytes; a corrupt or
/// foreign stream must not make us allocate gigabytes).
const MAX_LEN: usize = 64 << 20;
/// Nesting bound of decoded values (Metastore structs nest a few levels).
const MAX_DEPTH: usize = 64;

/// A Thrift value of any wire type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Bool(bool),
    Byte(i8),
    Double(f64),
    I16(i16),
    I32(i32),
    I64(i64),
    /// `string` and `binary` (one wire type).
    Bytes(Vec<u8>),
    Struct(Struct),
    Map {
        key: u8,
        value: u8,
        entries: Vec<(Value, Value)>,
    },
    Set {
        elem: u8,
        items: Vec<Value>,
    },
    List {
        elem: u8,
        items: Vec<Value>,
    },
}

/// A struct: its fields by id, in wire order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Struct(pub Vec<(i16, Value)>);

impl Value {
    /// A string value.
    pub fn str(s: impl Into<String>) -> Value {
        Value::Bytes(s.into().into_bytes())
    }

    /// A `map<string,string>`.
    pub fn string_map<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Value {
        Value::Map { key: ty::STRING, value: ty::STRING, entries: entries.into_iter().map(|(k, v)| (Value::str(k), Value::str(v))).collect() }
    }

    /// A `list<struct>`.
    pub fn struct_list(items: Vec<Struct>) -> Value {
        Value::List { elem: ty::STRUCT, items: items.into_iter().map(Value::Struct).collect() }
    }

    fn wire_type(&self) -> u8 {
        match self {
            Value::Bool(_) => ty::BOOL,
            Value::Byte(_) => ty::BYTE,
            Value::Double(_) => ty::DOUBLE,
            Value::I16(_) => ty::I16,
            Value::I32(_) => ty::I32,
            Value::I64(_) => ty::I64,
            Value::Bytes(_) => ty::STRING,
            Value::Struct(_) => ty::STRUCT,
            Value::Map { .. } => ty::MAP,
            Value::Set { .. } => ty::SET,
            Value::List { .. } => ty::LIST,
        }
    }

    /// The text of a string value (lossy for non-UTF-8 bytes).
    pub fn as_str(&self) -> Option<String> {
        match self {
            Value::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// The integer of an i16/i32/i64 value.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::I16(v) => Some(*v as i64),
            Value::I32(v) => Some(*v as i64),
            Value::I64(v) => Some(*v),
            _ => None,
        }
    }

    /// The entries of a `map<string,string>` (other maps: empty).
    pub fn as_string_map(&self) -> Vec<(String, String)> {
        match self {
            Value::Map { entries, .. } => entries.iter().filter_map(|(k, v)| Some((k.as_str()?, v.as_str()?))).collect(),
            _ => Vec::new(),
        }
    }
}

impl Struct {
    /// A struct of these fields.
    pub fn of(fields: impl IntoIterator<Item = (i16, Value)>) -> Struct {
        Struct(fields.into_iter().collect())
    }

    /// Field `id`, when present.
    pub fn get(&self, id: i16) -> Option<&Value> {
        self.0.iter().find(|(i, _)| *i == id).map(|(_, v)| v)
    }

    /// The string in field `id`.
    pub fn string(&self, id: i16) -> Option<String> {
        self.get(id).and_then(Value::as_str)
    }

    /// The struct in field `id`.
    pub fn child(&self, id: i16) -> Option<&Struct> {
        match self.get(id) {
            Some(Value::Struct(s)) => Some(s),
            _ => None,
        }
    }

    /// Sets field `id` (in place when present, else appended).
    pub fn set(&mut self, id: i16, value: Value) {
        match self.0.iter_mut().find(|(i, _)| *i == id) {
            Some(slot) => slot.1 = value,
            None => self.0.push((id, value)),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The connection failed. `sent`: the request may have reached the server.
    #[error("{source}")]
    Io {
        #[source]
        source: std::io::Error,
        sent: bool,
    },
    /// The server answered with something this client cannot parse (not a Metastore, or a framed transport).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server does not know the method or failed in its framework (Thrift's `TApplicationException`).
    #[error("the server refused `{method}`: {message}")]
    Application { method: String, message: String },
    /// The method threw one of its declared exceptions: the reply field id tells which, the struct what.
    #[error("{}", exception_message(.field, .exception))]
    Declared { field: i16, exception: Struct },
}

fn exception_message(field: &i16, e: &Struct) -> String {
    e.string(1).unwrap_or_else(|| format!("exception #{field}"))
}

impl CallError {
    /// The message of a declared exception (Metastore exceptions keep it in field 1).
    pub fn declared_message(&self) -> Option<String> {
        match self {
            CallError::Declared { exception, field } => Some(exception_message(field, exception)),
            _ => None,
        }
    }
}

fn io_err(e: std::io::Error, sent: bool) -> CallError {
    CallError::Io { source: e, sent }
}

/// One connection; calls are sequential (`&mut self`).
pub(crate) struct Connection {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    seq: i32,
}

impl Connection {
    /// Connects to `host:port` with `timeout` for the connect and for every read and write.
    pub fn open(addr: &str, timeout: Duration) -> std::io::Result<Connection> {
        use std::net::ToSocketAddrs;
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    s.set_read_timeout(Some(timeout))?;
                    s.set_write_timeout(Some(timeout))?;
                    s.set_nodelay(true)?;
                    return Ok(Connection { reader: BufReader::new(s.try_clone()?), writer: BufWriter::new(s), seq: 0 });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr}: no address"))))
    }

    /// Calls `method` with positional `args` (field ids 1, 2, …). Returns the reply's field 0 (`None` for `void`).
    pub fn call(&mut self, method: &str, args: Vec<Value>) -> Result<Option<Value>, CallError> {
        self.seq = self.seq.wrapping_add(1);
        let mut buf = Vec::with_capacity(256);
        write_message_header(&mut buf, method, CALL, self.seq);
        let args = Struct(args.into_iter().enumerate().map(|(i, v)| (i as i16 + 1, v)).collect());
        write_struct(&mut buf, &args);
        self.writer.write_all(&buf).and_then(|_| self.writer.flush()).map_err(|e| io_err(e, true))?;

        let r = &mut self.reader;
        let (name, kind, seq) = read_message_header(r)?;
        if name != method || seq != self.seq {
            return Err(CallError::Protocol(format!("reply `{name}` #{seq} to call `{method}` #{}", self.seq)));
        }
        let body = read_struct(r, 0)?;
        match kind {
            REPLY => {}
            EXCEPTION => {
                return Err(CallError::Application { method: method.into(), message: body.string(1).unwrap_or_default() });
            }
            k => return Err(CallError::Protocol(format!("message type {k} in reply to `{method}`"))),
        }
        let mut result = None;
        for (id, v) in body.0 {
            match (id, v) {
                (0, v) => result = Some(v),
                (field, Value::Struct(exception)) => return Err(CallError::Declared { field, exception }),
                (field, _) => return Err(CallError::Protocol(format!("reply field {field} of `{method}` is not an exception"))),
            }
        }
        Ok(result)
    }
}

fn write_message_header(buf: &mut Vec<u8>, method: &str, kind: u8, seq: i32) {
    buf.extend_from_slice(&(VERSION_1 | kind as u32).to_be_bytes());
    write_bytes(buf, method.as_bytes());
    buf.extend_from_slice(&seq.to_be_bytes());
}

fn write_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(&(b.len() as i32).to_be_bytes());
    buf.extend_from_slice(b);
}

/// Encodes a struct (its fields, then STOP).
pub(crate) fn write_struct(buf: &mut Vec<u8>, s: &Struct) {
    for (id, v) in &s.0 {
        buf.push(v.wire_type());
        buf.extend_from_slice(&id.to_be_bytes());
        write_value(buf, v);
    }
    buf.push(ty::STOP);
}

fn write_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Bool(b) => buf.push(*b as u8),
        Value::Byte(b) => buf.push(*b as u8),
        Value::Double(d) => buf.extend_from_slice(&d.to_bits().to_be_bytes()),
        Value::I16(i) => buf.extend_from_slice(&i.to_be_bytes()),
        Value::I32(i) => buf.extend_from_slice(&i.to_be_bytes()),
        Value::I64(i) => buf.extend_from_slice(&i.to_be_bytes()),
        Value::Bytes(b) => write_bytes(buf, b),
        Value::Struct(s) => write_struct(buf, s),
        Value::Map { key, value, entries } => {
            buf.push(*key);
            buf.push(*value);
            buf.extend_from_slice(&(entries.len() as i32).to_be_bytes());
            for (k, v) in entries {
                write_value(buf, k);
                write_value(buf, v);
            }
        }
        Value::Set { elem, items } | Value::List { elem, items } => {
            buf.push(*elem);
            buf.extend_from_slice(&(items.len() as i32).to_be_bytes());
            for i in items {
                write_value(buf, i);
            }
        }
    }
}

fn read_n<const N: usize>(r: &mut impl Read) -> Result<[u8; N], CallError> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).map_err(|e| io_err(e, true))?;
    Ok(b)
}

fn read_len(r: &mut impl Read) -> Result<usize, CallError> {
    let n = i32::from_be_bytes(read_n(r)?);
    if n < 0 || n as usize > MAX_LEN {
        return Err(CallError::Protocol(format!("length {n} out of bounds")));
    }
    Ok(n as usize)
}

fn read_bytes(r: &mut impl Read) -> Result<Vec<u8>, CallError> {
    let n = read_len(r)?;
    let mut b = Vec::new();
    r.take(n as u64).read_to_end(&mut b).map_err(|e| io_err(e, true))?;
    if b.len() != n {
        return Err(io_err(std::io::ErrorKind::UnexpectedEof.into(), true));
    }
    Ok(b)
}

fn read_message_header(r: &mut impl Read) -> Result<(String, u8, i32), CallError> {
    let word = u32::from_be_bytes(read_n(r)?);
    if word & 0xffff_0000 != VERSION_1 {
        return Err(CallError::Protocol(format!(
            "not a strict binary-protocol reply (first word {word:#010x}); is this a Hive Metastore's thrift port, unframed and without SASL?"
        )));
    }
    let name = String::from_utf8_lossy(&read_bytes(r)?).into_owned();
    let seq = i32::from_be_bytes(read_n(r)?);
    Ok((name, (word & 0xff) as u8, seq))
}

/// Decodes a struct (up to its STOP).
pub(crate) fn read_struct(r: &mut impl Read, depth: usize) -> Result<Struct, CallError> {
    if depth > MAX_DEPTH {
        return Err(CallError::Protocol("values nest too deep".into()));
    }
    let mut fields = Vec::new();
    loop {
        let [t] = read_n(r)?;
        if t == ty::STOP {
            return Ok(Struct(fields));
        }
        let id = i16::from_be_bytes(read_n(r)?);
        fields.push((id, read_value(r, t, depth + 1)?));
    }
}

fn read_value(r: &mut impl Read, t: u8, depth: usize) -> Result<Value, CallError> {
    Ok(match t {
        ty::BOOL => Value::Bool(read_n::<1>(r)?[0] != 0),
        ty::BYTE => Value::Byte(read_n::<1>(r)?[0] as i8),
        ty::DOUBLE => Value::Double(f64::from_bits(u64::from_be_bytes(read_n(r)?))),
        ty::I16 => Value::I16(i16::from_be_bytes(read_n(r)?)),
        ty::I32 => Value::I32(i32::from_be_bytes(read_n(r)?)),
        ty::I64 => Value::I64(i64::from_be_bytes(read_n(r)?)),
        ty::STRING => Value::Bytes(read_bytes(r)?),
        ty::STRUCT => Value::Struct(read_struct(r, depth)?),
        ty::MAP => {
            let [key, value] = read_n(r)?;
            let n = read_len(r)?;
            let mut entries = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                entries.push((read_value(r, key, depth + 1)?, read_value(r, value, depth + 1)?));
            }
            Value::Map { key, value, entries }
        }
        ty::SET | ty::LIST => {
            let [elem] = read_n(r)?;
            let n = read_len(r)?;
            let mut items = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                items.push(read_value(r, elem, depth + 1)?);
            }
            if t == ty::SET {
                Value::Set { elem, items }
            } else {
                Value::List { elem, items }
            }
        }
        other => return Err(CallError::Protocol(format!("unknown wire type {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Struct {
        let mut inner = Struct::of([(1, Value::str("col")), (2, Value::str("bigint"))]);
        inner.set(3, Value::Bool(true));
        Struct::of([
            (1, Value::str("orders")),
            (4, Value::I32(1_700_000_000)),
            (7, Value::Struct(Struct::of([(1, Value::struct_list(vec![inner])), (99, Value::Double(1.5))]))),
            (9, Value::string_map([("table_type", "ICEBERG"), ("metadata_location", "file:/x")])),
            (13, Value::Set { elem: ty::I64, items: vec![Value::I64(-1), Value::I64(i64::MAX)] }),
            (14, Value::Byte(-3)),
            (15, Value::I16(-2)),
            (16, Value::Map { key: ty::STRING, value: ty::LIST, entries: vec![(Value::str("k"), Value::List { elem: ty::BOOL, items: vec![] })] }),
        ])
    }

    #[test]
    fn a_decoded_struct_encodes_to_the_same_bytes() {
        let mut buf = Vec::new();
        write_struct(&mut buf, &sample());
        let back = read_struct(&mut buf.as_slice(), 0).unwrap();
        assert_eq!(back, sample());
        let mut again = Vec::new();
        write_struct(&mut again, &back);
        assert_eq!(again, buf);
        assert_eq!(back.get(9).unwrap().as_string_map()[1], ("metadata_location".into(), "file:/x".into()));
        assert_eq!(back.child(7).unwrap().get(99), Some(&Value::Double(1.5)));
    }

    #[test]
    fn set_replaces_in_place_and_appends_new_ids() {
        let mut s = sample();
        s.set(1, Value::str("renamed"));
        s.set(20, Value::I64(7));
        assert_eq!(s.0[0], (1, Value::str("renamed")));
        assert_eq!(s.0.last().unwrap(), &(20, Value::I64(7)));
    }

    #[test]
    fn lengths_out_of_bounds_and_truncated_input_are_errors_not_allocations() {
        let mut buf = vec![ty::STRING, 0, 1];
        buf.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(read_struct(&mut buf.as_slice(), 0), Err(CallError::Protocol(_))));
        let mut short = vec![ty::STRING, 0, 1];
        short.extend_from_slice(&10i32.to_be_bytes());
        short.extend_from_slice(b"abc");
        assert!(matches!(read_struct(&mut short.as_slice(), 0), Err(CallError::Io { .. })));
        assert!(matches!(read_struct(&mut [77u8, 0, 1].as_slice(), 0), Err(CallError::Protocol(_))));
    }

    #[test]
    fn a_reply_is_matched_to_its_call_and_exceptions_are_told_apart() {
        // a server on a socket: answers the first call with a declared exception, the second with field 0
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            for reply in [Struct::of([(2, Value::Struct(Struct::of([(1, Value::str("no such table"))])))]), Struct::of([(0, Value::str("ok"))])] {
                let (name, kind, seq) = read_message_header(&mut r).unwrap();
                assert_eq!(kind, CALL);
                let args = read_struct(&mut r, 0).unwrap();
                assert_eq!(args.string(1).as_deref(), Some("db"));
                let mut buf = Vec::new();
                write_message_header(&mut buf, &name, REPLY, seq);
                write_struct(&mut buf, &reply);
                w.write_all(&buf).unwrap();
            }
        });
        let mut c = Connection::open(&addr, Duration::from_secs(5)).unwrap();
        let e = c.call("get_table", vec![Value::str("db"), Value::str("t")]).unwrap_err();
        assert!(matches!(e, CallError::Declared { field: 2, .. }));
        assert_eq!(e.declared_message().as_deref(), Some("no such table"));
        assert_eq!(c.call("get_table", vec![Value::str("db")]).unwrap(), Some(Value::str("ok")));
        server.join().unwrap();
    }
}
