//! What S9's processes say to each other: the 48-byte packets of the CUDA
//! IPC ring, the lines its child processes print for the parent, and the
//! statistics the parent draws from them.
//!
//! # Contract
//!
//! * A [`Packet`] is [`PACKET_LEN`] bytes (the frame protocol's packet
//!   size, so both rings pay the same per-message cost): magic `"S9IP"`,
//!   a kind (1 frame, 2 release), the slot, the frame's sequence number
//!   and three `CLOCK_MONOTONIC` nanosecond timestamps (present called,
//!   GPU work done, packet sent; 0 where a side does not know one).
//!   [`Packet::decode`] refuses any other length, magic or kind.
//! * Child processes print one [`FrameLine`] per received frame (`S9F`,
//!   tab-separated, every timestamp in ns, 0 for unknown) and the frame
//!   ring's sender one [`SentLine`] per presented frame (`S9S`); any other
//!   line is the child's own output, which the parent shows.
//! * [`median`] and [`quantile`] never panic (NaN for no samples).
//! * Imports nothing of this crate.

/// Bytes in every packet: `cuda_interop_frames::protocol::PACKET_LEN`.
pub(crate) const PACKET_LEN: usize = 48;
const MAGIC: [u8; 4] = *b"S9IP";

/// What a packet says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The producer to a consumer: a frame is in `slot`.
    Frame,
    /// A consumer to the producer: its work on `slot` is enqueued after an
    /// event record; the slot may be written after that event.
    Release,
}

/// One packet of the IPC ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Packet {
    pub kind: Kind,
    pub slot: u32,
    pub sequence: u64,
    /// Present called, GPU work done, packet sent (ns, `CLOCK_MONOTONIC`).
    pub times: [u64; 3],
}

impl Packet {
    pub(crate) fn encode(&self) -> [u8; PACKET_LEN] {
        let mut b = [0u8; PACKET_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        let kind: u16 = match self.kind {
            Kind::Frame => 1,
            Kind::Release => 2,
        };
        b[4..6].copy_from_slice(&kind.to_le_bytes());
        b[8..12].copy_from_slice(&self.slot.to_le_bytes());
        b[16..24].copy_from_slice(&self.sequence.to_le_bytes());
        for (i, t) in self.times.iter().enumerate() {
            b[24 + 8 * i..32 + 8 * i].copy_from_slice(&t.to_le_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Packet, String> {
        if b.len() != PACKET_LEN {
            return Err(format!("a packet of {} bytes, not {PACKET_LEN}", b.len()));
        }
        if b[0..4] != MAGIC {
            return Err(format!("a packet with magic {:?}", &b[0..4]));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let kind = match u16::from_le_bytes([b[4], b[5]]) {
            1 => Kind::Frame,
            2 => Kind::Release,
            k => return Err(format!("a packet of kind {k}")),
        };
        Ok(Packet {
            kind,
            slot: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            sequence: u64_at(16),
            times: [u64_at(24), u64_at(32), u64_at(40)],
        })
    }
}

/// A consumer's record of one frame: the producer's three timestamps (0
/// where unknown), when the packet was received, and when CUDA had waited
/// for the frame (the wait enqueued and the stream synchronised).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameLine {
    pub sequence: u64,
    pub called: u64,
    pub gpu_done: u64,
    pub sent: u64,
    pub received: u64,
    pub waited: u64,
}

impl FrameLine {
    pub(crate) fn line(&self) -> String {
        format!(
            "S9F\t{}\t{}\t{}\t{}\t{}\t{}",
            self.sequence, self.called, self.gpu_done, self.sent, self.received, self.waited
        )
    }

    pub(crate) fn parse(line: &str) -> Option<FrameLine> {
        let rest = line.strip_prefix("S9F\t")?;
        let v: Vec<u64> = rest
            .split('\t')
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        match v.as_slice() {
            &[sequence, called, gpu_done, sent, received, waited] => Some(FrameLine {
                sequence,
                called,
                gpu_done,
                sent,
                received,
                waited,
            }),
            _ => None,
        }
    }

    /// Packet received to CUDA waited, µs.
    pub(crate) fn hand_off_us(&self) -> f64 {
        span_us(self.received, self.waited)
    }
}

/// The frame ring's sender's record of one frame: present called and
/// present returned (the GPU work done, "produced" signalled and the
/// packet sent, all inside the library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SentLine {
    pub sequence: u64,
    pub called: u64,
    pub returned: u64,
}

impl SentLine {
    pub(crate) fn line(&self) -> String {
        format!("S9S\t{}\t{}\t{}", self.sequence, self.called, self.returned)
    }

    pub(crate) fn parse(line: &str) -> Option<SentLine> {
        let rest = line.strip_prefix("S9S\t")?;
        let v: Vec<u64> = rest
            .split('\t')
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        match v.as_slice() {
            &[sequence, called, returned] => Some(SentLine {
                sequence,
                called,
                returned,
            }),
            _ => None,
        }
    }
}

/// `to - from` in µs (signed: two processes' reads of one clock).
pub(crate) fn span_us(from: u64, to: u64) -> f64 {
    (to as i128 - from as i128) as f64 / 1e3
}

/// The `q` quantile (0..=1) of `v` (sorted here); NaN for none.
pub(crate) fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip_and_refuse_what_is_not_one() {
        let p = Packet {
            kind: Kind::Release,
            slot: 3,
            sequence: 1 << 40,
            times: [1, 2, u64::MAX],
        };
        let b = p.encode();
        assert_eq!(b.len(), 48);
        assert_eq!(Packet::decode(&b), Ok(p));
        assert!(Packet::decode(&b[..47]).is_err());
        let mut bad = b;
        bad[0] = b'X';
        assert!(Packet::decode(&bad).is_err());
        let mut bad = b;
        bad[4] = 9;
        assert!(Packet::decode(&bad).is_err());
    }

    #[test]
    fn lines_round_trip_and_others_are_not_taken() {
        let f = FrameLine {
            sequence: 7,
            called: 100,
            gpu_done: 0,
            sent: 300,
            received: 400,
            waited: 12_400,
        };
        assert_eq!(FrameLine::parse(&f.line()), Some(f));
        assert_eq!(f.hand_off_us(), 12.0);
        let s = SentLine {
            sequence: 7,
            called: 1,
            returned: 2,
        };
        assert_eq!(SentLine::parse(&s.line()), Some(s));
        assert_eq!(FrameLine::parse("S9F\t1\t2"), None);
        assert_eq!(FrameLine::parse("hello"), None);
        assert_eq!(SentLine::parse(&f.line()), None);
    }

    #[test]
    fn quantiles_of_nothing_are_nan_and_spans_may_be_negative() {
        assert!(median(&mut []).is_nan());
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(quantile(&mut [1.0, 2.0, 3.0, 4.0, 5.0], 1.0), 5.0);
        assert_eq!(span_us(2000, 1000), -1.0);
    }
}
