//! A pickle reader that only builds data: it never imports a module, never
//! calls anything and never runs code from the file. `GLOBAL`/`REDUCE`
//! and friends become [`Value::Object`] (the class's name and its
//! arguments), so a file from another machine is as safe to read as JSON.
//!
//! Protocols 0–5 as far as data goes (what PyTorch's Flight Recorder
//! writes is protocol 2: dicts, lists, tuples, strings, ints, floats,
//! `None`, booleans). Memoized values live in an arena and are copied out
//! once at the end under a node budget, so a file that shares one list a
//! billion times is refused instead of exhausting memory.

use std::collections::BTreeMap;

/// A decoded pickle value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True`/`False`.
    Bool(bool),
    /// An integer (wider ones are kept as their decimal text in `BigInt`).
    Int(i64),
    /// An integer beyond 64 bits, as text.
    BigInt(String),
    /// A float.
    Float(f64),
    /// A `str`.
    Str(String),
    /// `bytes` / `bytearray`.
    Bytes(Vec<u8>),
    /// A list or a set.
    List(Vec<Value>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A dict; keys that are not strings are written as their debug text.
    Dict(BTreeMap<String, Value>),
    /// An object the pickle would have built by calling `class` (never
    /// called here): its arguments and `__setstate__` state.
    Object {
        /// `module.name`.
        class: String,
        /// Arguments.
        args: Vec<Value>,
        /// State given by `BUILD`.
        state: Option<Box<Value>>,
    },
}

impl Value {
    /// The dict's entry `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(d) => d.get(key),
            _ => None,
        }
    }
    /// As text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    /// As an integer (booleans count as 0/1, as in Python).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }
    /// As a sequence (list or tuple).
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }
}

/// Why a pickle could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// The data ended inside an opcode.
    #[error("ends early at byte {0}")]
    Truncated(usize),
    /// An opcode this reader does not take (it would need code or
    /// external state).
    #[error("opcode 0x{op:02x} at byte {at} is not data (or not pickle)")]
    Unsupported {
        /// The opcode.
        op: u8,
        /// Its offset.
        at: usize,
    },
    /// The opcodes do not fit together (stack or memo misuse).
    #[error("malformed at byte {at}: {what}")]
    Malformed {
        /// Where.
        at: usize,
        /// What.
        what: &'static str,
    },
    /// More values than the budget allows.
    #[error("more than {0} values: refused")]
    TooLarge(usize),
}

/// Values a file may expand to.
pub const NODE_BUDGET: usize = 20_000_000;

#[derive(Debug, Clone)]
enum Node {
    Leaf(Value),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    Object {
        class: String,
        args: Vec<usize>,
        state: Option<usize>,
    },
    Global(String),
}

enum Slot {
    Mark,
    Node(usize),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    arena: Vec<Node>,
    stack: Vec<Slot>,
    memo: BTreeMap<u64, usize>,
}

/// Decodes one pickle.
pub fn loads(data: &[u8]) -> Result<Value, PickleError> {
    let mut m = Machine {
        data,
        pos: 0,
        arena: Vec::new(),
        stack: Vec::new(),
        memo: BTreeMap::new(),
    };
    let root = m.run()?;
    // The size the tree will have once shared values are copied, counted
    // on the shared graph first (linear in the file), so an expansion
    // bomb is refused before anything is copied.
    if m.expanded_size(root)? > NODE_BUDGET as u64 {
        return Err(PickleError::TooLarge(NODE_BUDGET));
    }
    let mut budget = NODE_BUDGET;
    m.build(root, &mut budget, 0)
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or(PickleError::Truncated(self.pos))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        let mut v = 0u64;
        for (i, x) in b.iter().enumerate() {
            v |= (*x as u64) << (8 * i);
        }
        Ok(v)
    }
    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or(PickleError::Truncated(self.pos))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }
    fn bad(&self, what: &'static str) -> PickleError {
        PickleError::Malformed { at: self.pos, what }
    }
    fn push(&mut self, n: Node) -> Result<(), PickleError> {
        if self.arena.len() >= NODE_BUDGET {
            return Err(PickleError::TooLarge(NODE_BUDGET));
        }
        self.arena.push(n);
        self.stack.push(Slot::Node(self.arena.len() - 1));
        Ok(())
    }
    fn leaf(&mut self, v: Value) -> Result<(), PickleError> {
        self.push(Node::Leaf(v))
    }
    fn pop(&mut self) -> Result<usize, PickleError> {
        match self.stack.pop() {
            Some(Slot::Node(i)) => Ok(i),
            _ => Err(self.bad("pop of an empty stack or a mark")),
        }
    }
    fn top(&self) -> Result<usize, PickleError> {
        match self.stack.last() {
            Some(Slot::Node(i)) => Ok(*i),
            _ => Err(self.bad("no value on the stack")),
        }
    }
    fn pop_mark(&mut self) -> Result<Vec<usize>, PickleError> {
        let at = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| self.bad("no mark"))?;
        let items = self
            .stack
            .drain(at..)
            .skip(1)
            .map(|s| match s {
                Slot::Node(i) => i,
                Slot::Mark => unreachable!("rposition found the last mark"),
            })
            .collect();
        Ok(items)
    }
    fn text(&self, b: &[u8]) -> Result<String, PickleError> {
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("text that is not UTF-8"))
    }
    fn extend_list(&mut self, target: usize, items: Vec<usize>) -> Result<(), PickleError> {
        match &mut self.arena[target] {
            Node::List(v) => {
                v.extend(items);
                Ok(())
            }
            _ => Err(self.bad("append to a non-list")),
        }
    }
    fn set_items(&mut self, target: usize, items: Vec<usize>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.bad("odd number of dict items"));
        }
        let pairs: Vec<(usize, usize)> = items.chunks(2).map(|c| (c[0], c[1])).collect();
        match &mut self.arena[target] {
            Node::Dict(v) => {
                v.extend(pairs);
                Ok(())
            }
            // Objects built by REDUCE (an OrderedDict, a defaultdict) take
            // items too: keep them as the object's state.
            Node::Object { .. } => {
                self.arena.push(Node::Dict(pairs));
                let d = self.arena.len() - 1;
                if let Node::Object { state, .. } = &mut self.arena[target] {
                    *state = Some(d);
                }
                Ok(())
            }
            _ => Err(self.bad("setitem on a non-dict")),
        }
    }
    fn global_name(&self, i: usize) -> String {
        match &self.arena[i] {
            Node::Global(n) => n.clone(),
            Node::Leaf(Value::Str(s)) => s.clone(),
            _ => "?".to_string(),
        }
    }

    fn run(&mut self) -> Result<usize, PickleError> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            if op == b'.' {
                return self.pop();
            }
            let known = self.framing_op(op)?
                || self.scalar_op(op)?
                || self.container_op(op)?
                || self.memo_op(op)?
                || self.object_op(op)?;
            if !known {
                return Err(PickleError::Unsupported { op, at });
            }
        }
    }

    /// Protocol and frame markers, the mark and stack ops. `Ok(false)`: not one of them.
    fn framing_op(&mut self, op: u8) -> Result<bool, PickleError> {
        match op {
            0x80 => {
                self.u8()?; // PROTO
            }
            0x95 => {
                self.le(8)?; // FRAME
            }
            b'(' => self.stack.push(Slot::Mark),
            b'0' => {
                self.stack
                    .pop()
                    .ok_or_else(|| self.bad("pop of empty stack"))?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let t = self.top()?;
                self.stack.push(Slot::Node(t));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Ops that push a scalar: None, booleans, integers, floats, text and bytes. `Ok(false)`: not one of them.
    fn scalar_op(&mut self, op: u8) -> Result<bool, PickleError> {
        match op {
            b'N' => self.leaf(Value::None)?,
            0x88 => self.leaf(Value::Bool(true))?,
            0x89 => self.leaf(Value::Bool(false))?,
            b'K' => {
                let v = self.le(1)? as i64;
                self.leaf(Value::Int(v))?
            }
            b'M' => {
                let v = self.le(2)? as i64;
                self.leaf(Value::Int(v))?
            }
            b'J' => {
                let v = self.le(4)? as u32 as i32 as i64;
                self.leaf(Value::Int(v))?
            }
            b'I' | b'L' => {
                let l = self.line()?;
                let t = self.text(l)?;
                let t = t.trim_end_matches('L');
                let v = match t {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    _ => t
                        .parse::<i64>()
                        .map(Value::Int)
                        .unwrap_or_else(|_| Value::BigInt(t.to_string())),
                };
                self.leaf(v)?
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    self.le(1)? as usize
                } else {
                    self.le(4)? as usize
                };
                let b = self.take(n)?;
                let v = long_le(b);
                self.leaf(v)?
            }
            b'F' => {
                let l = self.line()?;
                let t = self.text(l)?;
                let v = t
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| self.bad("float text"))?;
                self.leaf(Value::Float(v))?
            }
            b'G' => {
                let b = self.take(8)?;
                let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                self.leaf(Value::Float(v))?
            }
            b'X' | 0x8c | 0x8d | b'V' => {
                let b = match op {
                    b'X' => {
                        let n = self.le(4)? as usize;
                        self.take(n)?
                    }
                    0x8c => {
                        let n = self.le(1)? as usize;
                        self.take(n)?
                    }
                    0x8d => {
                        let n = self.le(8)? as usize;
                        self.take(n)?
                    }
                    _ => self.line()?, // UNICODE: raw-unicode-escape text
                };
                let s = String::from_utf8_lossy(b).into_owned();
                self.leaf(Value::Str(s))?
            }
            b'S' => {
                let l = self.line()?;
                let t = String::from_utf8_lossy(l);
                let t = t.trim().trim_matches(|c| c == '\'' || c == '"').to_string();
                self.leaf(Value::Str(t))?
            }
            b'T' | b'U' | b'B' | b'C' | 0x8e | 0x96 => {
                let n = match op {
                    b'U' | b'C' => self.le(1)? as usize,
                    b'T' | b'B' => self.le(4)? as usize,
                    _ => self.le(8)? as usize,
                };
                let b = self.take(n)?.to_vec();
                // Python 2 strings (T, U) are text in practice.
                let v = if matches!(op, b'T' | b'U') {
                    Value::Str(String::from_utf8_lossy(&b).into_owned())
                } else {
                    Value::Bytes(b)
                };
                self.leaf(v)?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Ops that build or fill lists, tuples, sets and dicts. `Ok(false)`: not one of them.
    fn container_op(&mut self, op: u8) -> Result<bool, PickleError> {
        match op {
            b']' => self.push(Node::List(Vec::new()))?,
            b')' => self.push(Node::Tuple(Vec::new()))?,
            b'}' => self.push(Node::Dict(Vec::new()))?,
            0x8f => self.push(Node::List(Vec::new()))?, // EMPTY_SET
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Node::List(items))?
            }
            b't' | 0x91 => {
                let items = self.pop_mark()?;
                let n = if op == b't' {
                    Node::Tuple(items)
                } else {
                    Node::List(items)
                };
                self.push(n)?
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if self.stack.len() < n {
                    return Err(self.bad("tuple of missing values"));
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push(Node::Tuple(items))?
            }
            b'd' => {
                let items = self.pop_mark()?;
                if !items.len().is_multiple_of(2) {
                    return Err(self.bad("odd number of dict items"));
                }
                let pairs = items.chunks(2).map(|c| (c[0], c[1])).collect();
                self.push(Node::Dict(pairs))?
            }
            b'a' => {
                let v = self.pop()?;
                let l = self.top()?;
                self.extend_list(l, vec![v])?
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                let l = self.top()?;
                self.extend_list(l, items)?
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let d = self.top()?;
                self.set_items(d, vec![k, v])?
            }
            b'u' => {
                let items = self.pop_mark()?;
                let d = self.top()?;
                self.set_items(d, items)?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The memo: PUT and GET in their text, byte and word forms. `Ok(false)`: not one of them.
    fn memo_op(&mut self, op: u8) -> Result<bool, PickleError> {
        match op {
            b'p' | b'q' | b'r' | 0x94 => {
                let idx = match op {
                    b'p' => {
                        let l = self.line()?;
                        let t = self.text(l)?;
                        t.trim()
                            .parse::<u64>()
                            .map_err(|_| self.bad("memo index"))?
                    }
                    b'q' => self.le(1)?,
                    b'r' => self.le(4)?,
                    _ => self.memo.len() as u64,
                };
                let t = self.top()?;
                self.memo.insert(idx, t);
            }
            b'g' | b'h' | b'j' => {
                let idx = match op {
                    b'g' => {
                        let l = self.line()?;
                        let t = self.text(l)?;
                        t.trim()
                            .parse::<u64>()
                            .map_err(|_| self.bad("memo index"))?
                    }
                    b'h' => self.le(1)?,
                    _ => self.le(4)?,
                };
                let i = *self
                    .memo
                    .get(&idx)
                    .ok_or_else(|| self.bad("memo get of an unknown index"))?;
                self.stack.push(Slot::Node(i));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Globals, calls (REDUCE, NEWOBJ) and BUILD. `Ok(false)`: not one of them.
    fn object_op(&mut self, op: u8) -> Result<bool, PickleError> {
        match op {
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                let g = format!(
                    "{}.{}",
                    String::from_utf8_lossy(module),
                    String::from_utf8_lossy(name)
                );
                self.push(Node::Global(g))?
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let g = format!("{}.{}", self.global_name(module), self.global_name(name));
                self.push(Node::Global(g))?
            }
            b'R' | 0x81 | 0x92 => {
                let mut kwargs = None;
                if op == 0x92 {
                    kwargs = Some(self.pop()?);
                }
                let args = self.pop()?;
                let callable = self.pop()?;
                let mut a = match &self.arena[args] {
                    Node::Tuple(v) => v.clone(),
                    _ => vec![args],
                };
                a.extend(kwargs);
                let class = self.global_name(callable);
                self.push(Node::Object {
                    class,
                    args: a,
                    state: None,
                })?
            }
            b'b' => {
                let st = self.pop()?;
                let o = self.top()?;
                // BUILD on a plain container: keep the container.
                if let Node::Object { state, .. } = &mut self.arena[o] {
                    *state = Some(st);
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn children(&self, i: usize) -> Vec<usize> {
        match &self.arena[i] {
            Node::Leaf(_) | Node::Global(_) => Vec::new(),
            Node::List(v) | Node::Tuple(v) => v.clone(),
            Node::Dict(p) => p.iter().flat_map(|&(k, v)| [k, v]).collect(),
            Node::Object { args, state, .. } => args.iter().copied().chain(*state).collect(),
        }
    }

    /// Values under `root` once every shared one is copied (saturating);
    /// a cycle is an error.
    fn expanded_size(&self, root: usize) -> Result<u64, PickleError> {
        // 0 = unseen, 1 = on the path (a cycle if met again), 2 = done.
        let mut mark = vec![0u8; self.arena.len()];
        let mut size = vec![0u64; self.arena.len()];
        let mut stack = vec![(root, false)];
        while let Some((i, children_done)) = stack.pop() {
            if children_done {
                let total = self
                    .children(i)
                    .iter()
                    .fold(1u64, |acc, &c| acc.saturating_add(size[c]));
                size[i] = total;
                mark[i] = 2;
                continue;
            }
            match mark[i] {
                2 => continue,
                1 => {
                    return Err(PickleError::Malformed {
                        at: self.pos,
                        what: "a value that contains itself",
                    })
                }
                _ => {}
            }
            mark[i] = 1;
            stack.push((i, true));
            for c in self.children(i) {
                if mark[c] == 1 {
                    return Err(PickleError::Malformed {
                        at: self.pos,
                        what: "a value that contains itself",
                    });
                }
                if mark[c] == 0 {
                    stack.push((c, false));
                }
            }
        }
        Ok(size[root])
    }

    fn build(&self, i: usize, budget: &mut usize, depth: usize) -> Result<Value, PickleError> {
        if *budget == 0 {
            return Err(PickleError::TooLarge(NODE_BUDGET));
        }
        *budget -= 1;
        if depth > 512 {
            return Err(PickleError::Malformed {
                at: self.pos,
                what: "nesting deeper than 512 (or a cycle)",
            });
        }
        let d = depth + 1;
        Ok(match &self.arena[i] {
            Node::Leaf(v) => v.clone(),
            Node::Global(g) => Value::Object {
                class: g.clone(),
                args: Vec::new(),
                state: None,
            },
            Node::List(v) => Value::List(
                v.iter()
                    .map(|&j| self.build(j, budget, d))
                    .collect::<Result<_, _>>()?,
            ),
            Node::Tuple(v) => Value::Tuple(
                v.iter()
                    .map(|&j| self.build(j, budget, d))
                    .collect::<Result<_, _>>()?,
            ),
            Node::Dict(pairs) => {
                let mut m = BTreeMap::new();
                for &(k, v) in pairs {
                    let key = match self.build(k, budget, d)? {
                        Value::Str(s) => s,
                        Value::Int(i) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    m.insert(key, self.build(v, budget, d)?);
                }
                Value::Dict(m)
            }
            Node::Object { class, args, state } => Value::Object {
                class: class.clone(),
                args: args
                    .iter()
                    .map(|&j| self.build(j, budget, d))
                    .collect::<Result<_, _>>()?,
                state: match state {
                    Some(s) => Some(Box::new(self.build(*s, budget, d)?)),
                    None => None,
                },
            },
        })
    }
}

/// A little-endian two's complement integer of any width.
fn long_le(b: &[u8]) -> Value {
    if b.is_empty() {
        return Value::Int(0);
    }
    if b.len() <= 8 {
        let neg = b[b.len() - 1] & 0x80 != 0;
        let mut v: u64 = if neg { u64::MAX } else { 0 };
        for (i, x) in b.iter().enumerate() {
            v &= !(0xffu64 << (8 * i));
            v |= (*x as u64) << (8 * i);
        }
        return Value::Int(v as i64);
    }
    // Wider than 64 bits: keep it as hex text (never needed for dumps).
    let hex: String = b.iter().rev().map(|x| format!("{x:02x}")).collect();
    Value::BigInt(format!("0x{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_protocol_2_containers_and_memo() {
        // pickle.dumps({'a': [1, -2, 300, 70000], 'b': ('x', None, True), 'c': 1.5}, protocol=2)
        let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffM,\x01J\x70\x11\x01\x00eX\x01\x00\x00\x00bq\x03X\x01\x00\x00\x00xq\x04N\x88\x87q\x05X\x01\x00\x00\x00cq\x06G?\xf8\x00\x00\x00\x00\x00\x00u.";
        let v = loads(data).unwrap();
        assert_eq!(
            v.get("a").unwrap(),
            &Value::List(vec![
                Value::Int(1),
                Value::Int(-2),
                Value::Int(300),
                Value::Int(70000)
            ])
        );
        assert_eq!(
            v.get("b").unwrap(),
            &Value::Tuple(vec![Value::Str("x".into()), Value::None, Value::Bool(true)])
        );
        assert_eq!(v.get("c").unwrap(), &Value::Float(1.5));
    }

    #[test]
    fn globals_are_data_never_called() {
        // pickle.dumps(os.system('echo hi')) as an attacker writes it.
        let data = b"cposix\nsystem\n(S'echo hi'\ntR.";
        match loads(data).unwrap() {
            Value::Object { class, args, .. } => {
                assert_eq!(class, "posix.system");
                assert_eq!(args, vec![Value::Str("echo hi".into())]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn long1_is_signed() {
        assert_eq!(long_le(&[0xff]), Value::Int(-1));
        assert_eq!(long_le(&[0x00, 0x01]), Value::Int(256));
        assert_eq!(
            long_le(&[0x43, 0x33, 0x2f, 0x8f, 0x1d, 0xd6, 0xeb, 0x18]),
            Value::Int(0x18ebd61d8f2f3343)
        );
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let good = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01K\x02eu.";
        for cut in 0..good.len() {
            assert!(loads(&good[..cut]).is_err(), "cut at {cut}");
        }
        for (i, _) in good.iter().enumerate() {
            let mut b = good.to_vec();
            b[i] ^= 0x5a;
            let _ = loads(&b); // never panics
        }
        assert!(loads(b"hello world").is_err());
        assert!(loads(b"{\"version\": 1}").is_err());
    }

    #[test]
    fn shared_lists_expanding_past_the_budget_are_refused() {
        // l0 = [1]; l1 = [l0, l0]; ... 40 levels: 2^40 values when copied.
        let mut data = b"\x80\x02]q\x00K\x01a".to_vec();
        for i in 0..40u8 {
            data.extend_from_slice(b"(h");
            data.push(i);
            data.extend_from_slice(b"h");
            data.push(i);
            data.extend_from_slice(b"lq");
            data.push(i + 1);
        }
        data.push(b'.');
        assert!(matches!(loads(&data), Err(PickleError::TooLarge(_))));
    }
}
