//! Little-endian encoder and a decoder that fails cleanly on any short or malformed input.

use super::{BootError, Kind};

/// Encoder.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// Appends a u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    /// Appends a length-prefixed string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

/// Decoder over a message.
pub struct Dec<'a>(pub &'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], BootError> {
        if self.0.len() < n {
            return Err(BootError::new(Kind::Internal, "a bootstrap message is shorter than its contents"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    /// Reads a u32.
    pub fn u32(&mut self) -> Result<u32, BootError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    /// Reads a u64.
    pub fn u64(&mut self) -> Result<u64, BootError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// Reads length-prefixed bytes (never more than the message holds).
    pub fn bytes(&mut self) -> Result<Vec<u8>, BootError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    /// Reads a length-prefixed string.
    pub fn str(&mut self) -> Result<String, BootError> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }
}
