//! Env mode (`MCAST_BOOTSTRAP_ADDR`): the secret rule and its derivation, through the values of
//! the variables (the process environment is left alone: tests run in parallel).

use std::time::Instant;

use super::id::{checked_secret, derive_env_secret, env_mode_id};
use super::*;

const ADDR: &str = "127.0.0.1:29500";
const GOOD: &str = "9e4c1fa07b3d2865c0f1e97a4b6d3028";

fn refused(secret: Option<&str>) -> BootError {
    env_mode_id(Some(ADDR), secret).err().unwrap_or_else(|| panic!("secret {secret:?} was accepted"))
}

#[test]
fn a_missing_or_empty_secret_is_refused_naming_the_variable_and_how_to_make_one() {
    for secret in [None, Some(""), Some("  \n")] {
        let e = refused(secret);
        assert_eq!(e.kind, Kind::InvalidArgument, "{secret:?}");
        for needle in ["MCAST_BOOTSTRAP_SECRET", "is not", "32 hex digits", "128 bits", "openssl rand -hex 32", "fresh"]
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

/// Secrets long enough but too regular to be random: refused, saying why and how to make one,
/// without repeating them.
#[test]
fn weak_secrets_are_refused_saying_how_to_make_one() {
    let cases = [
        ("00000000000000000000000000000000", "one digit repeated"),
        ("ffffffffffffffffffffffffffffffffffffffff", "one digit repeated"),
        ("abababababababababababababababab", "a pattern of 2 digits repeated"),
        ("deadbeefdeadbeefdeadbeefdeadbeef", "a pattern of 8 digits repeated"),
        ("0123456789abcdef0123456789abcdef", "a pattern of 16 digits repeated"),
        ("0123456789abcdef0123456789abcdef0", "a pattern of 16 digits repeated"),
        ("123456789abcdef0123456789abcdef01", "a pattern of 16 digits repeated"),
        ("00112233445566778899aabbccddeeff", "a sequence"),
        ("0112233445566778899aabbccddeeff0", "a sequence"),
        ("02468ace02468ace02468ace02468ace", "a pattern of 8 digits repeated"),
        ("1111222233334444111122223333444a", "only 5 distinct digits"),
        ("1972031119720311197203111972031a", "only 7 distinct digits"),
    ];
    for (secret, why) in cases {
        let e = refused(Some(secret));
        assert_eq!(e.kind, Kind::InvalidArgument, "{secret}");
        assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET is too regular"), "{secret}: {}", e.message);
        assert!(e.message.contains(why), "{secret}: no {why:?} in {}", e.message);
        assert!(e.message.contains("openssl rand -hex 32"), "{}", e.message);
        assert!(!e.message.contains(secret), "the message repeats the secret: {}", e.message);
    }
    // Random ones pass (the odds of a false refusal are below 1e-7): a few fixed draws of
    // `openssl rand -hex 16` and `-hex 32`, and 2000 from the kernel.
    for good in
        [GOOD, "3f2a9c04d1e87b6650c3aa19e2f4d7b8", "c41d8a0b97e35f26ad0c3b1e8f7a6d5924c1b0e3f8d7a6c5b4e3d2f1a0b9c8d7"]
    {
        checked_secret(Some(good)).unwrap();
    }
    for _ in 0..2000 {
        let mut b = [0u8; 16];
        tcp::random_bytes(&mut b).unwrap();
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(super::id::weak_secret(&hex), None, "{hex}");
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
