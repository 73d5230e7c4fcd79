//! Contexts, teams and buffers: create, destroy, query; every context destroy checks the
//! simulator's ledger is empty.

use super::*;

impl Fuzzer {
    pub(super) fn context_create(&mut self) {
        if live(&self.m.ctxs).len() >= 3 {
            return self.context_destroy();
        }
        let mut c = std::mem::MaybeUninit::<mcast_config_t>::uninit();
        // SAFETY: a valid pointer.
        unsafe { mcast_config_init(c.as_mut_ptr()) };
        // SAFETY: mcast_config_init wrote every field.
        let mut c = unsafe { c.assume_init() };
        c.backend = mcast_backend_t(2);
        c.multicast = mcast_multicast_t(self.rng.pick(&[0, 0, 0, 1, 1, 2]));
        c.sim_devices = self.rng.pick(&[1, 2, 2, 3, 4, 4]);
        c.sim_device_memory = self.rng.pick(&[8u64, 16, 32, 64]) << 20;
        c.sim_multicast_slots = self.rng.pick(&[1, 2, 3, 8, 128]);
        c.sim_multicast_supported = u32::from(self.rng.pct(85));
        c.timeout_ms = self.rng.pick(&[20, 20, 50]);
        c.oom_retries = self.rng.pick(&[0, 0, 1, 2]);
        c.retry_backoff_ms = self.rng.pick(&[0, 1]);
        let mut null_out = false;
        let mut null_config = false;
        match self.rng.below(20) {
            0 => c.struct_size = self.rng.pick(&[0, 4, 8]),
            1 => c.backend.0 = self.rng.pick(&[3, 99, u32::MAX]),
            2 => c.multicast.0 = self.rng.pick(&[3, 99, u32::MAX]),
            3 => c.sim_devices = self.rng.pick(&[0, 73, 1000, u32::MAX]),
            4 => c.sim_device_memory = self.rng.pick(&[0, 1, u64::MAX]),
            5 => c.sim_multicast_slots = 0,
            6 => null_out = true,
            7 => null_config = true, // the environment: MCAST_BACKEND=sim, set by the test
            _ => {}
        }
        let mut out = mcast_context_t { id: 0xDEAD };
        let cfg_ptr = if null_config { std::ptr::null() } else { &c as *const _ };
        let out_ptr = if null_out { std::ptr::null_mut() } else { &mut out as *mut _ };
        // SAFETY: valid or NULL pointers.
        let s = unsafe { mcast_context_create(cfg_ptr, out_ptr) };
        let s = self.status(
            || {
                format!(
                    "mcast_context_create(devices {} mem {} slots {} mc {} supported {} size {} null {null_config}/{null_out})",
                    c.sim_devices, c.sim_device_memory, c.sim_multicast_slots, c.multicast.0, c.sim_multicast_supported,
                    c.struct_size
                )
            },
            s,
        );
        if s.0 == 0 {
            self.check(!null_out, || "context_create succeeded with a NULL out".into());
            let runtime = match handles::context(out.id) {
                Ok(r) => r,
                Err(e) => return self.fail(format!("a created context is not registered: {e}")),
            };
            if runtime.driver().as_sim().is_none() {
                self.fail("a context that is not simulated".into());
            }
            let devices = runtime.device_count() as i32;
            self.m.ctxs.push(Some(Ctx { handle: out, runtime, devices }));
            self.stats.contexts += 1;
        } else {
            self.check(out.id == 0xDEAD, || "context_create wrote its out-parameter on failure".into());
        }
    }

    /// Destroys context `i` through the C API and checks the simulator's ledger is empty.
    pub(super) fn destroy_context_at(&mut self, i: usize) {
        let c = self.m.ctxs[i].take().unwrap();
        let s = mcast_context_destroy(c.handle);
        let s = self.status(|| format!("mcast_context_destroy({:#x})", c.handle.id), s);
        self.check(s.0 == 0, || format!("destroying a live context gave {}", s.0));
        let ledger = c.runtime.driver().as_sim().unwrap().ledger();
        self.check(ledger.is_empty(), || format!("context destroyed, ledger not empty: {ledger}"));
        self.m.dead.push(c.handle.id);
        for t in self.m.teams.iter_mut() {
            if t.as_ref().is_some_and(|t| t.ctx == i) {
                self.m.dead.push(t.take().unwrap().handle.id);
            }
        }
        let teams = &self.m.teams;
        for b in self.m.bufs.iter_mut() {
            if b.as_ref().is_some_and(|b| teams[b.team].is_none()) {
                self.m.dead.push(b.take().unwrap().handle.id);
            }
        }
    }

    pub(super) fn context_destroy(&mut self) {
        let (i, h) = self.ctx(25);
        match i {
            Some(i) => self.destroy_context_at(i),
            None => {
                let s = mcast_context_destroy(h);
                let s = self.status(|| format!("mcast_context_destroy({:#x})", h.id), s);
                let want = if h.id == 0 { 0 } else { 2 };
                self.check(s.0 == want, || format!("destroying bad context {:#x} gave {}", h.id, s.0));
            }
        }
    }

    pub(super) fn context_queries(&mut self) {
        let (i, h) = self.ctx(15);
        let _ = i;
        match self.rng.below(3) {
            0 => {
                let mut counts = mcast_live_counts_t {
                    struct_size: self.rng.pick(&[std::mem::size_of::<mcast_live_counts_t>() as u32, 0, 8, 1000]),
                    ..Default::default()
                };
                let null = self.rng.pct(10);
                let p = if null { std::ptr::null_mut() } else { &mut counts as *mut _ };
                let s = if counts.struct_size == 1000 && !null {
                    // A caller with a newer, larger struct: 1000 valid bytes.
                    let mut big = vec![0u64; 125];
                    big[0] = u64::from_ne_bytes([0xE8, 0x03, 0, 0, 0, 0, 0, 0]);
                    if cfg!(target_endian = "big") {
                        big[0] = 1000u64 << 32;
                    }
                    // SAFETY: 1000 valid, 8-aligned bytes starting with struct_size = 1000.
                    unsafe { mcast_context_live_counts(h, big.as_mut_ptr().cast()) }
                } else {
                    // SAFETY: NULL or a valid pointer.
                    unsafe { mcast_context_live_counts(h, p) }
                };
                self.status(|| format!("mcast_context_live_counts({:#x}, null {null})", h.id), s);
            }
            1 => {
                let len = self.rng.pick(&[0usize, 1, 7, 64, 4096]);
                let mut buf = vec![1 as c_char; len];
                let p = if len == 0 && self.rng.pct(50) { std::ptr::null_mut() } else { buf.as_mut_ptr() };
                // SAFETY: a buffer of len bytes (or NULL with len 0).
                let need = unsafe { mcast_context_leak_report(h, p, len) };
                self.stats.calls += 1;
                if len > 0 {
                    let nul = buf.iter().position(|&b| b == 0);
                    self.check(nul.is_some_and(|n| n == need.min(len - 1)), || {
                        format!("leak report of {need} bytes into {len}: NUL at {nul:?}")
                    });
                }
            }
            _ => {
                let devices = i.map_or(4, |i| self.m.ctxs[i].as_ref().unwrap().devices);
                let dev = self.rank(devices);
                match self.rng.below(3) {
                    0 => {
                        let mut n: c_int = -77;
                        let p = if self.rng.pct(10) { std::ptr::null_mut() } else { &mut n as *mut _ };
                        // SAFETY: NULL or valid.
                        let s = unsafe { mcast_device_count(h, p) };
                        let s = self.status(|| format!("mcast_device_count({:#x})", h.id), s);
                        if s.0 == 0 {
                            self.check(n == devices, || format!("device count {n}, config {devices}"));
                        } else {
                            self.check(n == -77, || "device_count wrote on failure".into());
                        }
                    }
                    1 => {
                        // SAFETY: all-zero is a valid info struct.
                        let mut info: mcast_device_info_t = unsafe { std::mem::zeroed() };
                        info.struct_size = self.rng.pick(&[std::mem::size_of::<mcast_device_info_t>() as u32, 0, 4]);
                        let p = if self.rng.pct(10) { std::ptr::null_mut() } else { &mut info as *mut _ };
                        // SAFETY: NULL or valid.
                        let s = unsafe { mcast_device_get_info(h, dev, p) };
                        self.status(|| format!("mcast_device_get_info({:#x}, {dev})", h.id), s);
                    }
                    _ => {
                        let peer = self.rank(devices);
                        let mut can: c_int = -1;
                        let p = if self.rng.pct(10) { std::ptr::null_mut() } else { &mut can as *mut _ };
                        // SAFETY: NULL or valid.
                        let s = unsafe { mcast_device_can_access_peer(h, dev, peer, p) };
                        self.status(|| format!("mcast_device_can_access_peer({:#x}, {dev}, {peer})", h.id), s);
                    }
                }
            }
        }
    }

    // ---- teams ----

    pub(super) fn team_create(&mut self) {
        let (i, h) = self.ctx(10);
        let devices = i.map_or(4, |i| self.m.ctxs[i].as_ref().unwrap().devices);
        let n = match self.rng.below(20) {
            0 => 0,
            1 => 73,
            2 => -1,
            _ => 1 + self.rng.below(devices.max(1) as u64 + 1) as i32,
        };
        let distinct = self.rng.pct(70);
        let list: Vec<c_int> = (0..n.clamp(0, 73))
            .map(|r| {
                if self.rng.pct(3) {
                    self.rng.pick(&[-1, devices, 99])
                } else if distinct {
                    r % devices.max(1)
                } else {
                    self.rng.below(devices.max(1) as u64) as c_int
                }
            })
            .collect();
        let mut out = mcast_team_t { id: 0xDEAD };
        let null_devices = self.rng.pct(3);
        let null_out = self.rng.pct(3);
        let dp = if null_devices { std::ptr::null() } else { list.as_ptr() };
        let op = if null_out { std::ptr::null_mut() } else { &mut out as *mut _ };
        // SAFETY: `dp` is NULL or points to list.len() >= n.clamp(0, 73) ints; n = 73 with 73
        // entries; negative n is rejected before reading.
        let s = unsafe { mcast_team_create(h, dp, n, op) };
        let s = self.status(|| format!("mcast_team_create({:#x}, {list:?}, {n})", h.id), s);
        if s.0 == 0 {
            let ok = i.is_some() && !null_out && !null_devices;
            self.check(ok, || "team_create succeeded with a bad argument".into());
            if let Some(ci) = i {
                self.m.teams.push(Some(Team { handle: out, ctx: ci, size: n }));
                self.stats.teams += 1;
            }
        } else {
            self.check(out.id == 0xDEAD, || "team_create wrote its out-parameter on failure".into());
        }
    }

    pub(super) fn team_destroy(&mut self) {
        let (i, h) = self.team(20);
        let s = mcast_team_destroy(h);
        let s = self.status(|| format!("mcast_team_destroy({:#x})", h.id), s);
        match i {
            Some(i) => {
                let has_bufs = self.m.bufs.iter().flatten().any(|b| b.team == i);
                if has_bufs {
                    self.check(s.0 == 8, || format!("team with buffers: destroy gave {}", s.0));
                } else {
                    // Destroyed (a teardown error is still reported, but the handle is gone).
                    self.check(s.0 != 8, || "team without buffers: IN_USE".into());
                    self.m.dead.push(h.id);
                    self.m.teams[i] = None;
                }
            }
            None => {
                let want = if h.id == 0 { 0 } else { 2 };
                self.check(s.0 == want, || format!("destroying bad team {:#x} gave {}", h.id, s.0));
            }
        }
    }

    pub(super) fn team_info(&mut self) {
        let (i, h) = self.team(15);
        // SAFETY: all-zero is valid.
        let mut info: mcast_team_info_t = unsafe { std::mem::zeroed() };
        info.struct_size = self.rng.pick(&[std::mem::size_of::<mcast_team_info_t>() as u32, 0, 4]);
        let p = if self.rng.pct(5) { std::ptr::null_mut() } else { &mut info as *mut _ };
        // SAFETY: NULL or valid.
        let s = unsafe { mcast_team_get_info(h, p) };
        let s = self.status(|| format!("mcast_team_get_info({:#x})", h.id), s);
        if let (0, Some(i)) = (s.0, i) {
            let n = self.m.teams[i].as_ref().unwrap().size;
            self.check(info.size == n, || format!("team info size {} != {n}", info.size));
        }
    }

    // ---- buffers ----

    pub(super) fn buffer_alloc(&mut self) {
        let (i, h) = self.team(10);
        let bytes = match self.rng.below(20) {
            0 => 0,
            1 => usize::MAX,
            2 => usize::MAX / 3,
            3 => self.rng.pick(&[3 * MIB, 9 * MIB, 40 * MIB]),
            4..=6 => 1 + self.rng.below(MIB as u64) as usize,
            _ => 1 + self.rng.below(64 * 1024) as usize,
        };
        let mut out = mcast_buffer_t { id: 0xDEAD };
        let null_out = self.rng.pct(3);
        let op = if null_out { std::ptr::null_mut() } else { &mut out as *mut _ };
        // SAFETY: NULL or valid.
        let s = unsafe { mcast_buffer_alloc(h, bytes, op) };
        let s = self.status(|| format!("mcast_buffer_alloc({:#x}, {bytes})", h.id), s);
        if s.0 == 0 {
            self.check(i.is_some() && !null_out && bytes > 0, || "alloc succeeded with a bad argument".into());
            if let Some(ti) = i {
                self.m.bufs.push(Some(Buf { handle: out, team: ti, bytes }));
                self.stats.buffers += 1;
            }
        } else {
            self.check(out.id == 0xDEAD, || "alloc wrote its out-parameter on failure".into());
        }
    }

    pub(super) fn buffer_free(&mut self) {
        let (i, h) = self.buf(25);
        let s = mcast_buffer_free(h);
        let s = self.status(|| format!("mcast_buffer_free({:#x})", h.id), s);
        match i {
            Some(i) => {
                // Freed whatever the status (a failed wait is reported after the memory returns).
                self.check(s.0 != 2 && s.0 != 1, || format!("freeing a live buffer gave {}", s.0));
                self.m.dead.push(h.id);
                self.m.bufs[i] = None;
            }
            None => {
                let want = if h.id == 0 { 0 } else { 2 };
                self.check(s.0 == want, || format!("freeing bad buffer {:#x} gave {}", h.id, s.0));
            }
        }
    }

    pub(super) fn buffer_queries(&mut self) {
        let (i, h) = self.buf(15);
        let n = i.map_or(2, |i| self.m.teams[self.m.bufs[i].as_ref().unwrap().team].as_ref().unwrap().size);
        let bytes = i.map_or(4096, |i| self.m.bufs[i].as_ref().unwrap().bytes);
        let null = self.rng.pct(5);
        match self.rng.below(6) {
            0 => {
                let mut size = 7usize;
                let p = if null { std::ptr::null_mut() } else { &mut size as *mut _ };
                // SAFETY: NULL or valid.
                let s = unsafe { mcast_buffer_size(h, p) };
                let s = self.status(|| format!("mcast_buffer_size({:#x})", h.id), s);
                if s.0 == 0 {
                    self.check(size == bytes, || format!("buffer size {size} != {bytes}"));
                } else {
                    self.check(size == 7, || "buffer_size wrote on failure".into());
                }
            }
            1..=3 => {
                let rank = self.rank(n);
                let peer = self.rank(n);
                // A non-NULL marker (address 1, c_void's alignment) that a failing query must leave as it is.
                let unset = std::ptr::dangling_mut::<c_void>();
                let mut ptr: *mut c_void = unset;
                let p = if null { std::ptr::null_mut() } else { &mut ptr as *mut _ };
                let which = self.rng.below(3);
                // SAFETY: NULL or valid out pointers; the pointers returned are not dereferenced.
                let s = unsafe {
                    match which {
                        0 => mcast_buffer_local_ptr(h, rank, p),
                        1 => mcast_buffer_peer_ptr(h, rank, peer, p),
                        _ => mcast_buffer_multicast_ptr(h, rank, p),
                    }
                };
                let name = ["mcast_buffer_local_ptr", "mcast_buffer_peer_ptr", "mcast_buffer_multicast_ptr"];
                let s = self.status(|| format!("{}({:#x}, {rank}, {peer})", name[which as usize], h.id), s);
                if s.0 != 0 {
                    self.check(ptr == unset, || "a pointer query wrote on failure".into());
                } else {
                    self.check(!ptr.is_null(), || "a NULL pointer returned".into());
                }
            }
            _ => {
                let rank = self.rank(n);
                let offset = self.size_near(bytes);
                let len = if self.rng.pct(80) {
                    self.rng.below(bytes.saturating_sub(offset.min(bytes)) as u64 + 2) as usize
                } else {
                    self.size_near(bytes)
                };
                // A host buffer of len bytes up to 1 MiB + 2; beyond that the pointer is NULL, so
                // the library must refuse before copying.
                let host_len = if len <= MIB + 2 { len } else { 0 };
                let mut host = vec![0x5Au8; host_len];
                let null_data = null || host_len != len;
                let write = self.rng.pct(50);
                // SAFETY: the pointer is NULL or `host`, which holds len bytes.
                let s = unsafe {
                    if write {
                        let p = if null_data { std::ptr::null() } else { host.as_ptr().cast() };
                        mcast_buffer_write(h, rank, offset, p, len)
                    } else {
                        let p = if null_data { std::ptr::null_mut() } else { host.as_mut_ptr().cast() };
                        mcast_buffer_read(h, rank, offset, p, len)
                    }
                };
                let name = if write { "mcast_buffer_write" } else { "mcast_buffer_read" };
                let s = self.status(|| format!("{name}({:#x}, {rank}, {offset}, {len}, null {null_data})", h.id), s);
                if s.0 == 0 {
                    let in_range = offset.checked_add(len).is_some_and(|e| e <= bytes);
                    self.check(i.is_some() && in_range && rank >= 0 && rank < n, || {
                        format!("{name} accepted rank {rank} offset {offset} len {len} of {bytes}")
                    });
                }
            }
        }
    }
}
