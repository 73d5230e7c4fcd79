//! Handshake (the listener is the server, and it proves itself first):
//! 1. server → `HELLO` = magic + its fresh 32-byte nonce `ns`;
//! 2. client → `NONCE` = its fresh 32-byte nonce `nc`, nothing derived from the secret;
//! 3. server → `PROOF` = HMAC-SHA256(secret, "mcast bootstrap server proof" | magic | ns | nc);
//! 4. the client checks it (in constant time) and only if it holds sends `PROOF` =
//!    HMAC-SHA256(secret, "mcast bootstrap client proof" | magic | ns | nc), which the server
//!    checks the same way.
//!
//! Both nonces are fresh on every connection, so a recorded proof is worth nothing on
//! another; the labels keep a server's proof from passing as a client's. SECURITY: a client
//! proves nothing to a listener that has not proved the secret, so a fake listener (or one
//! answering in the real one's place) learns no MAC to test guesses of the secret against.
//! A stranger who connects to a real listener, or who records a handshake, does learn a MAC
//! over known nonces and could test guesses offline; that is acceptable because the secret is
//! not a password: a root-mode id's secret is 256 random bits from the kernel, and the
//! environment mode's secret is stretched from `MCAST_BOOTSTRAP_SECRET` by a slow KDF, so no
//! dictionary is worth running.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::sealed::Secured;
use super::{expect_frame, kind, random_bytes, write_frame, Deadline, HANDSHAKE_MS, MAX_HANDSHAKE_FRAME, SECRET_BYTES};

const HELLO_MAGIC: &[u8; 8] = b"MCASTBS2";
pub(super) const NONCE: usize = 32;
const MAC: usize = 32;
const SERVER_PROOF: &[u8] = b"mcast bootstrap server proof";
const CLIENT_PROOF: &[u8] = b"mcast bootstrap client proof";
const CLIENT_TO_SERVER: &[u8] = b"mcast bootstrap key client to server";
const SERVER_TO_CLIENT: &[u8] = b"mcast bootstrap key server to client";

fn mac(secret: &[u8; SECRET_BYTES], label: &[u8], ns: &[u8], nc: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(label);
    m.update(HELLO_MAGIC);
    m.update(ns);
    m.update(nc);
    m
}

/// The two directions' keys of a connection: (client to server, server to client).
pub(super) fn keys(secret: &[u8; SECRET_BYTES], ns: &[u8], nc: &[u8]) -> (ChaCha20Poly1305, ChaCha20Poly1305) {
    let mut salt = [0u8; 2 * NONCE];
    salt[..NONCE].copy_from_slice(ns);
    salt[NONCE..].copy_from_slice(nc);
    let hk = Hkdf::<Sha256>::new(Some(&salt), secret);
    let key = |info: &[u8]| {
        let mut k = [0u8; 32];
        hk.expand(info, &mut k).expect("32 bytes is a valid HKDF-SHA256 length");
        ChaCha20Poly1305::new(&k.into())
    };
    (key(CLIENT_TO_SERVER), key(SERVER_TO_CLIENT))
}

/// Server side of the handshake on a fresh connection, bounded by `deadline`: the server
/// proves the secret first, then checks the client's proof.
pub fn prove_server(mut s: TcpStream, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<Secured, String> {
    s.set_write_timeout(Some(deadline.remaining_or(Duration::from_secs(5)).max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let mut ns = [0u8; NONCE];
    random_bytes(&mut ns).map_err(|e| e.to_string())?;
    let mut hello = HELLO_MAGIC.to_vec();
    hello.extend_from_slice(&ns);
    write_frame(&mut s, kind::HELLO, &hello).map_err(|e| e.to_string())?;
    let nc = expect_frame(&mut s, kind::NONCE, MAX_HANDSHAKE_FRAME, deadline)?;
    if nc.len() != NONCE {
        return Err(format!("a nonce of {} bytes (expected {NONCE})", nc.len()));
    }
    let mine = mac(secret, SERVER_PROOF, &ns, &nc).finalize().into_bytes();
    write_frame(&mut s, kind::PROOF, &mine).map_err(|e| e.to_string())?;
    let theirs = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, deadline)?;
    if theirs.len() != MAC {
        return Err(format!("a proof of {} bytes (expected {MAC})", theirs.len()));
    }
    mac(secret, CLIENT_PROOF, &ns, &nc)
        .verify_slice(&theirs)
        .map_err(|_| "the connection does not know the team's secret".to_string())?;
    let (c2s, s2c) = keys(secret, &ns, &nc);
    Ok(Secured::new(s, s2c, c2s))
}

/// Client side of the handshake, bounded by `deadline`: the client sends its proof only after
/// the server's checked out.
pub fn prove_client(mut s: TcpStream, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<Secured, String> {
    s.set_write_timeout(Some(deadline.remaining_or(Duration::from_secs(5)).max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let hello = expect_frame(&mut s, kind::HELLO, MAX_HANDSHAKE_FRAME, deadline)?;
    if hello.len() != HELLO_MAGIC.len() + NONCE || &hello[..HELLO_MAGIC.len()] != HELLO_MAGIC {
        return Err("the listener is not an mcast bootstrap of this version".into());
    }
    let ns = &hello[HELLO_MAGIC.len()..];
    let mut nc = [0u8; NONCE];
    random_bytes(&mut nc).map_err(|e| e.to_string())?;
    write_frame(&mut s, kind::NONCE, &nc).map_err(|e| e.to_string())?;
    let theirs = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, deadline)?;
    mac(secret, SERVER_PROOF, ns, &nc)
        .verify_slice(&theirs)
        .map_err(|_| "the listener does not know the team's secret (a stale or foreign id?)".to_string())?;
    let mine = mac(secret, CLIENT_PROOF, ns, &nc).finalize().into_bytes();
    write_frame(&mut s, kind::PROOF, &mine).map_err(|e| e.to_string())?;
    let (c2s, s2c) = keys(secret, ns, &nc);
    Ok(Secured::new(s, c2s, s2c))
}

/// Connects to `addr` and runs the handshake, retrying refused connections (the listener may
/// not be up yet) until `deadline`.
pub fn connect(addr: SocketAddr, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<Secured, String> {
    let mut last = String::new();
    loop {
        let left = deadline.remaining_or(Duration::from_secs(10));
        if deadline.passed() || left.is_zero() {
            return Err(format!("cannot reach the bootstrap at {addr}: {last}"));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                let hs = deadline.min(Duration::from_millis(HANDSHAKE_MS * 5));
                match prove_client(s, secret, hs) {
                    Ok(c) => return Ok(c),
                    Err(e) => return Err(format!("bootstrap handshake with {addr}: {e}")),
                }
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;

    use super::super::Acceptor;
    use super::*;

    #[test]
    fn handshake_accepts_the_secret_and_refuses_others() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let acc = Acceptor::start(l, [7; SECRET_BYTES], "test").unwrap();
        // Wrong secret: the client sees the server's proof fail or the connection close.
        assert!(connect(addr, &[8; SECRET_BYTES], Deadline::after_ms(3000)).is_err());
        let mut s = connect(addr, &[7; SECRET_BYTES], Deadline::after_ms(3000)).unwrap();
        s.send(kind::JOIN, b"hi").unwrap();
        let (_, join) = acc.next(Deadline::after_ms(3000)).unwrap();
        assert_eq!(join, b"hi");
        assert!(acc.next(Deadline::after_ms(50)).is_none());
    }

    fn proof_of(label: &[u8], secret: &[u8; SECRET_BYTES], ns: &[u8], nc: &[u8]) -> Vec<u8> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap();
        m.update(label);
        m.update(HELLO_MAGIC);
        m.update(ns);
        m.update(nc);
        m.finalize().into_bytes().to_vec()
    }

    /// The listener proves the secret first: a client that sends nothing but its nonce after
    /// HELLO gets the server's proof (and nothing an offline guess could use is asked of it).
    #[test]
    fn the_server_proves_first() {
        let secret = [7; SECRET_BYTES];
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let _acc = Acceptor::start(l, secret, "test").unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = expect_frame(&mut s, kind::HELLO, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000)).unwrap();
        assert_eq!(hello.len(), HELLO_MAGIC.len() + NONCE);
        let ns = &hello[HELLO_MAGIC.len()..];
        let nc = [3u8; NONCE];
        write_frame(&mut s, kind::NONCE, &nc).unwrap();
        let theirs = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000))
            .expect("the server sent its proof before asking for the client's");
        assert_eq!(theirs, proof_of(b"mcast bootstrap server proof", &secret, ns, &nc));
    }

    /// A client whose listener fails its proof sends nothing more (no MAC to test guesses on).
    #[test]
    fn a_client_never_proves_to_a_server_that_failed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let client =
            std::thread::spawn(move || connect(addr, &[7; SECRET_BYTES], Deadline::after_ms(3000)).map(|_| ()));
        let (mut s, _) = l.accept().unwrap();
        let mut hello = HELLO_MAGIC.to_vec();
        hello.extend_from_slice(&[1u8; NONCE]);
        write_frame(&mut s, kind::HELLO, &hello).unwrap();
        let first = expect_frame(&mut s, kind::NONCE, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000)).unwrap();
        assert_eq!(first.len(), NONCE, "the client's first frame holds only its nonce");
        // A server that does not know the secret.
        write_frame(&mut s, kind::PROOF, &[0u8; MAC]).unwrap();
        let e = client.join().unwrap().unwrap_err();
        assert!(e.contains("does not know the team's secret"), "{e}");
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "the client sent {} more bytes after a failed server proof", rest.len());
    }
}
