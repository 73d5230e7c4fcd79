//! After the handshake every frame either way is sealed ([`Sealer`], [`Opener`]): the payload
//! encrypted and authenticated with ChaCha20-Poly1305, the 5-byte head (length and kind) as
//! associated data, one key per direction from HKDF-SHA256 (key: the secret; salt: `ns | nc`;
//! info: the direction), and the direction's 64-bit frame count as the nonce, so a key never
//! sees a nonce twice and a frame altered, replayed, reordered, dropped before a later one, or
//! made up fails to open. On the wire the length then counts the 16-byte tag after the
//! ciphertext.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};

use super::{read_head, Deadline, FrameError, UntilDeadline};

/// Bytes of a sealed frame's authentication tag.
pub const TAG: usize = 16;

/// The AEAD nonce of frame `seq` of a direction.
fn nonce_of(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_le_bytes());
    n.into()
}

/// The sending half of a sealed channel: one direction's key and frame count.
pub struct Sealer {
    aead: ChaCha20Poly1305,
    seq: u64,
}

impl Sealer {
    pub(super) fn new(aead: ChaCha20Poly1305) -> Sealer {
        Sealer { aead, seq: 0 }
    }

    /// `payload` as a sealed frame of `kind`, under the next frame number.
    pub fn seal(&mut self, kind: u8, payload: &[u8]) -> io::Result<Vec<u8>> {
        let len = payload.len() + TAG;
        let len32 = u32::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("a frame of {len} bytes")))?;
        let seq = self.seq;
        // A number is used once: the connection ends before the count would wrap.
        self.seq = seq.checked_add(1).ok_or_else(|| io::Error::other("the frame count of a connection ran out"))?;
        let mut buf = Vec::with_capacity(5 + len);
        buf.extend_from_slice(&len32.to_le_bytes());
        buf.push(kind);
        buf.extend_from_slice(payload);
        let (head, body) = buf.split_at_mut(5);
        let tag = self
            .aead
            .encrypt_in_place_detached(&nonce_of(seq), head, body)
            .map_err(|_| io::Error::other("sealing a bootstrap frame failed"))?;
        buf.extend_from_slice(&tag);
        Ok(buf)
    }

    /// Seals and writes one frame.
    pub fn send(&mut self, w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
        let frame = self.seal(kind, payload)?;
        w.write_all(&frame)
    }
}

/// The receiving half of a sealed channel.
pub struct Opener {
    aead: ChaCha20Poly1305,
    seq: u64,
}

impl Opener {
    pub(super) fn new(aead: ChaCha20Poly1305) -> Opener {
        Opener { aead, seq: 0 }
    }

    /// Reads and opens the next frame of at most `cap` payload bytes: `(kind, payload)`.
    /// Allocates at most `cap` + [`TAG`] bytes, whatever the stream holds. A frame that does
    /// not open under the next frame number is [`FrameError::Auth`]; the connection is then
    /// worth nothing and its owner drops it.
    pub fn open(&mut self, r: &mut impl Read, cap: usize) -> Result<(u8, Vec<u8>), FrameError> {
        let head = read_head(r)?;
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        if len > cap.saturating_add(TAG) {
            return Err(FrameError::TooLarge(len - TAG));
        }
        if len < TAG {
            return Err(FrameError::Auth);
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).map_err(FrameError::Io)?;
        let (text, tag) = body.split_at_mut(len - TAG);
        let tag = Tag::clone_from_slice(tag);
        self.aead.decrypt_in_place_detached(&nonce_of(self.seq), &head, text, &tag).map_err(|_| FrameError::Auth)?;
        self.seq = self.seq.checked_add(1).ok_or(FrameError::Auth)?;
        body.truncate(len - TAG);
        Ok((head[4], body))
    }
}

/// A connection that passed the handshake: the stream and both directions' keys. Every frame
/// after the handshake goes through [`Secured::send`] / [`Secured::expect`] (or the halves,
/// once split between a writer and a reader thread).
pub struct Secured {
    /// The connection.
    pub stream: TcpStream,
    /// Seals what this side sends.
    pub tx: Sealer,
    /// Opens what the peer sends.
    pub rx: Opener,
}

impl Secured {
    pub(super) fn new(stream: TcpStream, tx: ChaCha20Poly1305, rx: ChaCha20Poly1305) -> Secured {
        Secured { stream, tx: Sealer::new(tx), rx: Opener::new(rx) }
    }

    /// Seals and writes one frame.
    pub fn send(&mut self, kind: u8, payload: &[u8]) -> io::Result<()> {
        self.tx.send(&mut &self.stream, kind, payload)
    }

    /// Reads and opens a frame of `want` kind before `deadline`.
    pub fn expect(&mut self, want: u8, cap: usize, deadline: Deadline) -> Result<Vec<u8>, String> {
        let (k, p) = self.rx.open(&mut UntilDeadline { s: &self.stream, deadline }, cap).map_err(|e| e.to_string())?;
        if k != want {
            return Err(format!("expected a frame of kind {want}, got kind {k}"));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::super::handshake::{keys, NONCE};
    use super::super::{kind, SECRET_BYTES};
    use super::*;

    /// The two ends of one direction of a connection.
    fn direction() -> (Sealer, Opener) {
        let (tx, _) = keys(&[1; SECRET_BYTES], &[2; NONCE], &[3; NONCE]);
        let (rx, _) = keys(&[1; SECRET_BYTES], &[2; NONCE], &[3; NONCE]);
        (Sealer { aead: tx, seq: 0 }, Opener { aead: rx, seq: 0 })
    }

    fn open(rx: &mut Opener, frame: &[u8]) -> Result<(u8, Vec<u8>), FrameError> {
        rx.open(&mut std::io::Cursor::new(frame), 64)
    }

    #[test]
    fn sealed_frames_open_once_and_in_order() {
        let (mut tx, mut rx) = direction();
        let f0 = tx.seal(kind::EXCH, b"secret zero").unwrap();
        let f1 = tx.seal(kind::EXCH, b"secret one").unwrap();
        assert!(!f0.windows(6).any(|w| w == b"secret"), "the payload travels in the clear");
        assert_eq!(open(&mut rx, &f0).unwrap(), (kind::EXCH, b"secret zero".to_vec()));
        // Replayed.
        assert!(matches!(open(&mut rx, &f0), Err(FrameError::Auth)));
        // Reordered.
        let (_, mut rx) = direction();
        assert!(matches!(open(&mut rx, &f1), Err(FrameError::Auth)));
        // The kind and the length are authenticated too.
        for at in [0, 4, 5, f0.len() - 1] {
            let (_, mut rx) = direction();
            let mut bad = f0.clone();
            bad[at] ^= 1;
            assert!(open(&mut rx, &bad).is_err(), "byte {at} altered");
        }
        // The other direction's key, and a frame too short to hold a tag.
        let (_, s2c) = keys(&[1; SECRET_BYTES], &[2; NONCE], &[3; NONCE]);
        let mut other = Opener { aead: s2c, seq: 0 };
        assert!(matches!(open(&mut other, &f0), Err(FrameError::Auth)));
        let (_, mut rx) = direction();
        assert!(matches!(open(&mut rx, &[3, 0, 0, 0, kind::EXCH, 1, 2, 3]), Err(FrameError::Auth)));
        // A length above the cap is refused before anything is read or allocated.
        assert!(matches!(open(&mut rx, &[0xff, 0xff, 0xff, 0xff, kind::EXCH]), Err(FrameError::TooLarge(_))));
    }

    /// Any change to a sealed frame (bytes altered, cut short, or random input) fails to open.
    #[test]
    fn fuzz_the_opener() {
        let (mut tx, _) = direction();
        let frame = tx.seal(kind::RESULT, &[0x5a; 40]).unwrap();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..5000 {
            let input: Vec<u8> = if i % 2 == 0 {
                (0..next() % 80).map(|_| next() as u8).collect()
            } else {
                let mut v = frame.clone();
                let at = next() as usize % v.len();
                v[at] ^= 1 + (next() % 255) as u8;
                v.truncate(v.len() - next() as usize % 2);
                v
            };
            let (_, mut rx) = direction();
            assert!(open(&mut rx, &input).is_err(), "input {i} opened");
        }
        let (_, mut rx) = direction();
        assert_eq!(open(&mut rx, &frame).unwrap(), (kind::RESULT, vec![0x5a; 40]));
    }
}
