//! Fault injection, daemon restarts, and the end of the fault window.

use super::*;

impl DataWorld {
    // ---- faults ----

    pub(super) fn inject_fault(&mut self) {
        if self.faults_over {
            return;
        }
        self.report.faults += 1;
        let n = self.cfg.daemons;
        match self.rng.below(14) {
            0..=2 => {
                // Crash: unsynced data is lost; the process restarts later.
                let osd = self.rng.below(n as u64) as u32;
                if !self.daemons[&osd].alive {
                    return;
                }
                let alive = self.daemons.values().filter(|d| d.alive).count();
                if alive <= 1 {
                    return;
                }
                self.report.crashes += 1;
                self.log(|| format!("FAULT: osd.{osd} crashes"));
                let d = self.daemons.get_mut(&osd).expect("daemon exists");
                d.alive = false;
                d.store = None;
                d.disk = d.disk.crash();
                let back = self.rng.range(500, 6_000);
                self.at(back, Ev::Restart { osd });
            }
            3..=4 => {
                // A daemon cut off from everyone.
                let osd = self.rng.below(n as u64) as u32;
                let len = self.rng.range(1_000, 8_000);
                self.log(|| format!("FAULT: osd.{osd} isolated for {len} ms"));
                let mut others = vec![Node::Mon];
                others.extend((0..n).filter(|&o| o != osd).map(Node::Osd));
                others.extend((0..self.cfg.clients).map(Node::Client));
                for other in others {
                    self.net.partition(Node::Osd(osd), other);
                    self.at(len, Ev::HealPair(Node::Osd(osd), other));
                }
            }
            5 => {
                // A daemon cut off from the monitor only: marked down while it still
                // serves at its old epoch (a deposed primary that does not know it).
                let osd = self.rng.below(n as u64) as u32;
                let len = self.rng.range(2_000, 8_000);
                self.log(|| format!("FAULT: osd.{osd} cut from the monitor for {len} ms"));
                self.net.partition(Node::Osd(osd), Node::Mon);
                self.at(len, Ev::HealPair(Node::Osd(osd), Node::Mon));
            }
            6 => {
                // Two daemons cannot talk (both still reach the monitor).
                let a = self.rng.below(n as u64) as u32;
                let b = self.rng.below(n as u64) as u32;
                if a == b {
                    return;
                }
                let len = self.rng.range(500, 5_000);
                self.log(|| format!("FAULT: osd.{a} <-> osd.{b} cut for {len} ms"));
                self.net.partition(Node::Osd(a), Node::Osd(b));
                self.at(len, Ev::HealPair(Node::Osd(a), Node::Osd(b)));
            }
            9 => {
                // Slow disks (degraded devices, a shared storage backend, a noisy
                // neighbour): transactions queue up.
                let len = self.rng.range(1_000, 6_000);
                let lo = self.rng.range(5, 40);
                let hi = self.rng.range(lo + 20, 250);
                let until = self.now_ms + len;
                // Which daemons: each one with even odds (at least one).
                let mut who: Vec<u32> = (0..n).filter(|_| self.rng.below(2) == 0).collect();
                if who.is_empty() {
                    who.push(self.rng.below(n as u64) as u32);
                }
                self.log(|| {
                    format!(
                        "FAULT: slow disks on {who:?} for {len} ms ({lo}-{hi} ms a transaction)"
                    )
                });
                for id in who {
                    if let Some(d) = self.daemons.get_mut(&id) {
                        d.slow_until_ms = until;
                        d.slow_ms = (lo, hi);
                    }
                }
            }
            10 => {
                // A daemon's disk stalls: nothing completes until it recovers, then the
                // queue drains (writes acknowledged by the others wait in it).
                let osd = self.rng.below(n as u64) as u32;
                let len = self.rng.range(200, 1_500);
                self.log(|| format!("FAULT: osd.{osd} disk stalls for {len} ms"));
                let until = self.now_ms + len;
                if let Some(d) = self.daemons.get_mut(&osd) {
                    d.stall_until_ms = d.stall_until_ms.max(until);
                }
            }
            11..=12 => {
                // Overload: a burst of I/O makes every disk slow (transactions queue
                // up), and one daemon, busy, misses its heartbeats: the monitor marks it
                // down ("wrongly marked me down") while it still serves at its old map,
                // its replicas holding its last writes in their queues.
                let len = self.rng.range(2_500, 6_000);
                let lo = self.rng.range(5, 40);
                let hi = self.rng.range(lo + 20, 250);
                let osd = self.rng.below(n as u64) as u32;
                let cut = self.rng.range(DOWN_AFTER_MS + 300, len);
                self.log(|| {
                    format!(
                        "FAULT: overload for {len} ms ({lo}-{hi} ms a transaction), \
                         osd.{osd} misses its heartbeats for {cut} ms"
                    )
                });
                let until = self.now_ms + len;
                for d in self.daemons.values_mut() {
                    d.slow_until_ms = until;
                    d.slow_ms = (lo, hi);
                }
                self.net.partition(Node::Osd(osd), Node::Mon);
                self.at(cut, Ev::HealPair(Node::Osd(osd), Node::Mon));
            }
            _ => {
                let len = self.rng.range(1_000, 8_000);
                self.net.config = NetConfig {
                    delay_ms_min: 1,
                    delay_ms_max: self.rng.range(20, BAD_DELAY_MS_MAX),
                    loss_ppm: self.rng.range(0, 100_000) as u32,
                    duplicate_ppm: self.rng.range(0, 100_000) as u32,
                };
                let cfg = self.net.config;
                self.log(|| format!("FAULT: bad network for {len} ms: {cfg:?}"));
                self.at(len, Ev::HealNet);
            }
        }
    }

    pub(super) fn restart(&mut self, osd: u32) {
        let Some(d) = self.daemons.get_mut(&osd) else {
            return;
        };
        if d.alive {
            return;
        }
        let store = match Store::open_on(Arc::new(d.disk.clone()), store_config()) {
            Ok(s) => s,
            Err(e) => {
                let e = e.to_string();
                self.fail(format!(
                    "osd.{osd}: the store does not reopen after a crash: {e}"
                ));
                return;
            }
        };
        self.log(|| format!("osd.{osd} restarts"));
        let d = self.daemons.get_mut(&osd).expect("daemon exists");
        d.alive = true;
        d.inc += 1;
        d.store = Some(store);
        d.epoch = 0;
        d.queue.clear();
        d.disk_busy = false;
        d.gate = TxnGate::new();
        d.primaries.clear();
        d.pending.clear();
        d.out_streams.clear();
        d.in_streams.clear();
        let inc = d.inc;
        self.ec_restart(osd); // EC hook
        self.at(0, Ev::OsdTick { osd, inc });
        let at = self.rng.range(200, 2_000);
        self.at(at, Ev::Checkpoint { osd, inc });
    }

    pub(super) fn end_faults(&mut self) {
        self.faults_over = true;
        self.net.heal_all();
        self.net.config = self.clean_net;
        for d in self.daemons.values_mut() {
            d.slow_until_ms = 0;
            d.stall_until_ms = 0;
        }
        let dead: Vec<u32> = self
            .daemons
            .iter()
            .filter(|(_, d)| !d.alive)
            .map(|(id, _)| *id)
            .collect();
        for osd in dead {
            self.restart(osd);
        }
        self.log(|| "faults over".into());
    }
}
