//! Env mode (`MCAST_BOOTSTRAP_ADDR`): the secret rule and its derivation, through the values of
//! the variables (the process environment is left alone: tests run in parallel).

use std::time::Instant;

use super::id::{checked_secret, derive_env_secret, env_mode_id};
use super::*;

const ADDR: &str = "127.0.0.1:29500";
const GOOD: &str = "00112233445566778899aabbccddeeff";

fn refused(secret: Option<&str>) -> BootError {
    env_mode_id(Some(ADDR), secret).err().unwrap_or_else(|| panic!("secret {secret:?} was accepted"))
}

#[test]
fn a_missing_or_empty_secret_is_refused_naming_the_variable_and_how_to_make_one() {
    for secret in [None, Some(""), Some("  \n")] {
        let e = refused(secret);
        assert_eq!(e.kind, Kind::InvalidArgument, "{secret:?}");
        for needle in ["MCAST_BOOTSTRAP_SECRET", "is not", "32 hex digits", "128 bits", "openssl rand -hex 16", "fresh"]
        {
            assert!(e.message.contains(needle), "{secret:?}: no {needle:?} in: {}", e.message);
        }
    }
}

#[test]
fn a_short_or_non_hex_secret_is_refused_without_repeating_it() {
    let short = "0123456789abcdef0123456789abcde"; // 31 digits: 124 bits
    let e = refused(Some(short));
    assert_eq!(e.kind, Kind::InvalidArgument);
    assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET has 31 hex digits (124 bits)"), "{}", e.message);
    assert!(!e.message.contains(short), "the message repeats the secret: {}", e.message);
    for bad in ["job-4711", "correct horse battery staple, long enough to pass a length rule", &format!("{GOOD}-x")] {
        let e = refused(Some(bad));
        assert_eq!(e.kind, Kind::InvalidArgument, "{bad}");
        assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET holds characters other than hex digits"), "{}", e.message);
        assert!(!e.message.contains(bad), "the message repeats the secret: {}", e.message);
    }
}

#[test]
fn no_address_is_no_env_mode_and_a_bad_address_is_refused_first() {
    assert!(env_mode_id(None, None).unwrap().is_none());
    assert!(env_mode_id(Some(" "), Some("x")).unwrap().is_none());
    let e = env_mode_id(Some("not-an-address"), None).err().unwrap();
    assert!(e.message.contains("MCAST_BOOTSTRAP_ADDR=not-an-address"), "{}", e.message);
}

#[test]
fn a_good_secret_makes_one_id_per_address_and_secret_stretched_by_the_kdf() {
    assert_eq!(checked_secret(Some(&format!(" {} \n", GOOD.to_uppercase()))).unwrap(), GOOD);
    let t = Instant::now();
    let id = env_mode_id(Some(ADDR), Some(GOOD)).unwrap().unwrap();
    let first = t.elapsed();
    eprintln!("the env-mode secret derivation took {first:?}");
    assert!(id.rank0_listens);
    assert_eq!(id.addr, ADDR.parse().unwrap());
    // Every process of the job derives the same id (case and surrounding space aside).
    let again = env_mode_id(Some(ADDR), Some(&format!("{}\n", GOOD.to_uppercase()))).unwrap().unwrap();
    assert_eq!(again, id);
    // The derivation is paid once per process (the last pair is cached).
    let t = Instant::now();
    assert_eq!(derive_env_secret(id.addr, GOOD), id.secret);
    assert!(t.elapsed() < first / 4, "{first:?} then {:?}", t.elapsed());
    // Another address or another secret: another id secret.
    let other_addr = env_mode_id(Some("127.0.0.1:29501"), Some(GOOD)).unwrap().unwrap();
    assert_ne!(other_addr.secret, id.secret);
    let longer = format!("{GOOD}0");
    assert_ne!(derive_env_secret(id.addr, &longer), id.secret);
    // Not one SHA-256 of the inputs: PBKDF2 with the address as salt.
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(GOOD.as_bytes());
    h.update(ADDR.as_bytes());
    assert_ne!(<[u8; 32]>::from(h.finalize()), id.secret);
}
