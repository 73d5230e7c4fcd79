//! Tests of fault plans, injected faults and panics, and the call log.

use super::*;

// ---- faults and call log ----

/// Each spec is refused with a message naming its bad part.
fn assert_refused(cases: &[(&str, &str)]) {
    for &(spec, bad) in cases {
        let err = parse_faults(spec).expect_err(spec);
        assert!(err.contains(bad), "{spec}: {err}");
    }
}

#[test]
fn parse_faults_valid_items() {
    let plan =
        parse_faults("cuMulticastBindMem=OUT_OF_MEMORY@2, cuMemCreate=CUDA_ERROR_OUT_OF_MEMORY@1x3,cuMemMap=801@4+,")
            .unwrap();
    let rule =
        |func: &str, code, first, count| FaultRule { func: func.into(), action: FaultAction::Fail(code), first, count };
    assert_eq!(
        plan.rules,
        vec![
            rule("cuMulticastBindMem", CuResult::ERROR_OUT_OF_MEMORY, 2, Some(1)),
            rule("cuMemCreate", CuResult::ERROR_OUT_OF_MEMORY, 1, Some(3)),
            rule("cuMemMap", CuResult::ERROR_NOT_SUPPORTED, 4, None),
        ]
    );
    assert!(parse_faults("").unwrap().rules.is_empty());
    let r = &plan.rules[1];
    assert!(!r.hits(0) && r.hits(1) && r.hits(3) && !r.hits(4));
    assert!(plan.rules[2].hits(1000) && !plan.rules[2].hits(3));
}

#[test]
fn parse_faults_malformed_items_are_named() {
    assert_refused(&[
        ("cuMemCreate", "`cuMemCreate`"),
        ("cuMemCreate=OUT_OF_MEMORY", "`cuMemCreate=OUT_OF_MEMORY`"),
        ("cuMemCreat=OUT_OF_MEMORY@1", "cuMemCreat"),
        ("cuMemMap=NO_SUCH_CODE@1", "NO_SUCH_CODE"),
        ("cuMemMap=SUCCESS@1", "cuMemMap=SUCCESS@1"),
        ("cuMemCreate=OUT_OF_MEMORY@1,cuMemMap=OUT_OF_MEMORY@0", "cuMemMap=OUT_OF_MEMORY@0"),
        ("cuMemMap=OUT_OF_MEMORY@2x0", "2x0"),
        ("cuMemMap=OUT_OF_MEMORY@x", "@x"),
        ("cuMemMap=OUT_OF_MEMORY@-1+", "-1+"),
    ]);
}

#[test]
fn parse_faults_panic_items() {
    let plan = parse_faults("cuMemCreate=PANIC@1, cuMemMap=PANIC@2x3,cuMulticastCreate=OUT_OF_MEMORY@1").unwrap();
    let actions: Vec<_> = plan.rules.iter().map(|r| (r.func.as_str(), r.action, r.first, r.count)).collect();
    assert_eq!(
        actions,
        vec![
            ("cuMemCreate", FaultAction::Panic, 1, Some(1)),
            ("cuMemMap", FaultAction::Panic, 2, Some(3)),
            ("cuMulticastCreate", FaultAction::Fail(CuResult::ERROR_OUT_OF_MEMORY), 1, Some(1)),
        ]
    );
    // Still strict: the function must exist, the spelling is exact, a call number is needed.
    assert_refused(&[
        ("cuMemCreat=PANIC@1", "cuMemCreat"),
        ("cuMemCreate=panic@1", "panic"),
        ("cuMemCreate=PANIC", "`cuMemCreate=PANIC`"),
        ("cuMemCreate=PANIC@0", "PANIC@0"),
        ("cuMemCreate=PANICS@1", "PANICS"),
    ]);
}

#[test]
fn injected_panic_has_no_effect_and_leaves_no_lock_held() {
    let faults = parse_faults("cuMemCreate=PANIC@2").unwrap();
    let s = SimDriver::new(SimConfig { faults, ..config() });
    let a = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.mem_create(0, G, HandleTypes::NONE)))
        .expect_err("the 2nd cuMemCreate panics");
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(msg, "injected panic in cuMemCreate");
    assert_eq!(s.call_count("cuMemCreate"), 2, "the panicking call was counted");
    assert_eq!(s.ledger().allocations[0], 1, "the panicking call created nothing");
    // Every lock is free again: the state, the call counts and the log all work.
    let b = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    assert_eq!(s.call_log().iter().filter(|f| **f == "cuMemCreate").count(), 3);
    for h in [a, b] {
        s.mem_release(h).unwrap();
    }
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

#[test]
fn configured_faults_fail_the_chosen_calls_without_effect() {
    let faults = parse_faults("cuMemCreate=OUT_OF_MEMORY@2x2,cuMulticastCreate=SYSTEM_NOT_READY@1").unwrap();
    let s = SimDriver::new(SimConfig { faults, ..config() });
    let a = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let e = s.mem_create(0, G, HandleTypes::NONE).unwrap_err();
    assert_eq!(e, DriverError::new("cuMemCreate", CuResult::ERROR_OUT_OF_MEMORY));
    assert_eq!(code(s.mem_create(0, G, HandleTypes::NONE)), CuResult::ERROR_OUT_OF_MEMORY);
    assert_eq!(s.ledger().allocations[0], 1, "failed calls created nothing");
    let b = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let p = prop(1, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_create(&p)), CuResult::ERROR_SYSTEM_NOT_READY);
    assert_eq!(s.ledger().multicast_objects, 0);
    let mc = s.multicast_create(&p).unwrap();
    for h in [a, b, mc] {
        s.mem_release(h).unwrap();
    }
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

#[test]
fn injected_faults_count_from_injection_and_clear() {
    let s = sim();
    let mc = team(&s, 1, 2 * G, HandleTypes::NONE);
    let h = s.mem_create(0, 2 * G, HandleTypes::NONE).unwrap();
    s.multicast_bind_mem(mc, 0, h, 0, G, 0).unwrap();
    s.inject("cuMulticastBindMem", CuResult::ERROR_OUT_OF_MEMORY, 1, Some(1));
    assert_eq!(code(s.multicast_bind_mem(mc, G, h, G, G, 0)), CuResult::ERROR_OUT_OF_MEMORY);
    assert_eq!(s.ledger().bindings, 1, "a faulted bind binds nothing");
    s.multicast_bind_mem(mc, G, h, G, G, 0).unwrap();
    s.inject("cuMulticastUnbind", CuResult::ERROR_ILLEGAL_STATE, 2, None);
    s.multicast_unbind(mc, 0, 0, G).unwrap();
    assert_eq!(code(s.multicast_unbind(mc, 0, G, G)), CuResult::ERROR_ILLEGAL_STATE);
    assert_eq!(code(s.multicast_unbind(mc, 0, G, G)), CuResult::ERROR_ILLEGAL_STATE);
    s.clear_faults();
    s.multicast_unbind(mc, 0, G, G).unwrap();
    assert_eq!(s.call_count("cuMulticastUnbind"), 4);
}

#[test]
fn call_log_enumerates_driver_calls() {
    let s = sim();
    s.reset_call_log();
    let (h, va) = mapped(&s, 0, G, HandleTypes::NONE);
    unmapped_free(&s, h, va, G);
    assert_eq!(
        s.call_log(),
        [
            "cuMemCreate",
            "cuMemAddressReserve",
            "cuMemMap",
            "cuMemSetAccess",
            "cuMemUnmap",
            "cuMemAddressFree",
            "cuMemRelease"
        ]
    );
    for name in s.call_log() {
        assert!(FUNCTION_NAMES.contains(&name));
    }
    s.reset_call_log();
    assert!(s.call_log().is_empty());
    assert_eq!(s.call_count("cuMemCreate"), 1);
}
