//! The headline targets of `spindle bench fio`, each computed only when its anchor was
//! measured in the same run (see [`targets`]).

use super::{ratio, PoolShape, Row, QUICK};
use serde::Serialize;

/// Whether a target's value must be at least or at most the required one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    AtLeast,
    AtMost,
}

/// A headline target and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub name: String,
    pub value: f64,
    pub required: f64,
    pub bound: Bound,
    pub met: bool,
}

/// What the targets can be computed against.
#[derive(Debug, Clone, Copy)]
pub(super) struct TargetContext {
    pub(super) pool: PoolShape,
    /// Ceph ran in this sitting (the published figures give no valid ratio).
    pub(super) ceph_same_sitting: bool,
}

/// The headline targets, each only when its anchor was measured in this run:
/// - against Ceph (same sitting only): replicated pool: 4k randwrite and randread QD16
///   IOPS >= 5x, 4k randwrite and randread QD1 latency >= 3x better, 512k write and read
///   QD16 MB/s >= 2x; erasure-coded pool: >= 2x Ceph EC 2+1 on every quick point
///   (latency at QD1, throughput at QD16);
/// - erasure-coded pool: p99 <= 10x mean completion latency on every quick point;
/// - against nbdkit memory: 4k randwrite QD16 IOPS >= 0.3x, 4k randread QD16 IOPS >=
///   0.4x, 4k randread QD1 latency <= 3x nbdkit's;
/// - against the disk: 512k read QD16 MB/s >= 0.9x the disk's; 512k write QD16 MB/s >=
///   0.7x the disk's divided by the pool's write amplification (3 copies: / 3).
pub(super) fn targets(rows: &[Row], ctx: TargetContext) -> Vec<TargetCheck> {
    let find = |bs: &str, rw: &str, qd: u32| rows.iter().find(|r| r.point.is(bs, rw, qd));
    let mut t = Vec::new();
    let mut push = |name: String, value: Option<f64>, bound: Bound, required: f64| {
        if let Some(value) = value.filter(|v| v.is_finite()) {
            let met = match bound {
                Bound::AtLeast => value >= required,
                Bound::AtMost => value <= required,
            };
            t.push(TargetCheck {
                name,
                value,
                required,
                bound,
                met,
            });
        }
    };
    if ctx.ceph_same_sitting && ctx.pool.erasure {
        for r in rows
            .iter()
            .filter(|r| QUICK.iter().any(|&(b, w, q)| r.point.is(b, w, q)))
        {
            if r.point.iodepth == 1 {
                push(
                    format!("{} latency: Ceph EC 2+1 / Spindle", r.point.label()),
                    r.latency_vs_ceph,
                    Bound::AtLeast,
                    2.0,
                );
            } else {
                push(
                    format!("{} IOPS / Ceph EC 2+1", r.point.label()),
                    r.iops_vs_ceph,
                    Bound::AtLeast,
                    2.0,
                );
            }
        }
    } else if ctx.ceph_same_sitting {
        let ceph = [
            ("4k", "randwrite", 16, "IOPS", 5.0),
            ("4k", "randread", 16, "IOPS", 5.0),
            ("4k", "randwrite", 1, "latency", 3.0),
            ("4k", "randread", 1, "latency", 3.0),
            ("512k", "write", 16, "MB/s", 2.0),
            ("512k", "read", 16, "MB/s", 2.0),
        ];
        for (bs, rw, qd, what, required) in ceph {
            let Some(r) = find(bs, rw, qd) else { continue };
            let (name, value) = match what {
                "IOPS" => (format!("{} IOPS / Ceph", r.point.label()), r.iops_vs_ceph),
                "MB/s" => (format!("{} MB/s / Ceph", r.point.label()), r.mbs_vs_ceph),
                _ => (
                    format!("{} latency: Ceph / Spindle", r.point.label()),
                    r.latency_vs_ceph,
                ),
            };
            push(name, value, Bound::AtLeast, required);
        }
    }
    if ctx.pool.erasure {
        for r in rows
            .iter()
            .filter(|r| QUICK.iter().any(|&(b, w, q)| r.point.is(b, w, q)))
        {
            push(
                format!("{} p99 / mean clat", r.point.label()),
                ratio(r.spindle.clat_p99_us, r.spindle.clat_mean_us),
                Bound::AtMost,
                10.0,
            );
        }
    }
    push(
        "4k randwrite QD16 IOPS / nbdkit memory".into(),
        find("4k", "randwrite", 16).and_then(|r| r.iops_vs_nbdkit),
        Bound::AtLeast,
        0.3,
    );
    push(
        "4k randread QD16 IOPS / nbdkit memory".into(),
        find("4k", "randread", 16).and_then(|r| r.iops_vs_nbdkit),
        Bound::AtLeast,
        0.4,
    );
    push(
        "4k randread QD1 clat: Spindle / nbdkit memory".into(),
        find("4k", "randread", 1).and_then(|r| {
            r.nbdkit_memory
                .and_then(|n| ratio(r.spindle.clat_mean_us, n.clat_mean_us))
        }),
        Bound::AtMost,
        3.0,
    );
    push(
        "512k read QD16 MB/s / disk".into(),
        find("512k", "read", 16).and_then(|r| r.mbs_vs_disk),
        Bound::AtLeast,
        0.9,
    );
    let amplification = ctx.pool.write_amplification;
    push(
        format!("512k write QD16 MB/s / (disk / {amplification})"),
        find("512k", "write", 16).and_then(|r| r.mbs_vs_disk.map(|v| v * amplification)),
        Bound::AtLeast,
        0.7,
    );
    t
}

#[cfg(test)]
mod tests {
    use super::super::{points, CpuPerIo, Figures, Measured, Point};
    use super::*;

    fn figures(iops: f64, mb_per_s: f64, clat_mean_us: f64, clat_p99_us: f64) -> Figures {
        Figures {
            iops,
            mb_per_s,
            clat_mean_us,
            clat_p99_us,
        }
    }

    fn measured(f: Figures) -> Measured {
        Measured {
            figures: f,
            cpu: None,
        }
    }

    const REPLICATED: PoolShape = PoolShape {
        erasure: false,
        write_amplification: 3.0,
    };
    const EC21: PoolShape = PoolShape {
        erasure: true,
        write_amplification: 1.5,
    };

    fn find<'a>(t: &'a [TargetCheck], name: &str) -> Option<&'a TargetCheck> {
        t.iter().find(|c| c.name == name)
    }

    /// Rows of the quick points with every anchor measured.
    fn quick_rows(spindle: impl Fn(&Point) -> Figures, ceph_cpu: bool) -> Vec<Row> {
        points(true)
            .into_iter()
            .map(|p| {
                let s = spindle(&p);
                let anchor = figures(1000.0, 100.0, 1000.0, 3000.0);
                let cpu = CpuPerIo {
                    server_us_per_io: 1000.0,
                    client_us_per_io: 500.0,
                };
                let spindle_cpu = CpuPerIo {
                    server_us_per_io: 400.0,
                    client_us_per_io: 100.0,
                };
                Row::new(
                    p,
                    Measured {
                        figures: s,
                        cpu: Some(spindle_cpu),
                    },
                    Some(measured(figures(10_000.0, 1000.0, 100.0, 300.0))),
                    Some(figures(2000.0, 1000.0, 500.0, 900.0)),
                    Some(Measured {
                        figures: anchor,
                        cpu: ceph_cpu.then_some(cpu),
                    }),
                )
            })
            .collect()
    }

    #[test]
    fn row_ratios() {
        let rows = quick_rows(|_| figures(5000.0, 500.0, 250.0, 1000.0), true);
        let r = &rows[0];
        assert_eq!(r.iops_vs_ceph, Some(5.0));
        assert_eq!(r.mbs_vs_ceph, Some(5.0));
        assert_eq!(r.latency_vs_ceph, Some(4.0));
        assert_eq!(r.iops_vs_nbdkit, Some(0.5));
        assert_eq!(r.mbs_vs_disk, Some(0.5));
        assert_eq!(r.cpu_vs_ceph, Some(3.0));
    }

    /// Replicated pool, every anchor measured: the Ceph, nbdkit and disk targets, with
    /// their bounds.
    #[test]
    fn replicated_targets_with_every_anchor() {
        let rows = quick_rows(|_| figures(5000.0, 500.0, 250.0, 1000.0), true);
        let t = targets(
            &rows,
            TargetContext {
                pool: REPLICATED,
                ceph_same_sitting: true,
            },
        );
        let names: Vec<&str> = t.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "4k randwrite QD16 IOPS / Ceph",
                "4k randread QD16 IOPS / Ceph",
                "4k randwrite QD1 latency: Ceph / Spindle",
                "4k randread QD1 latency: Ceph / Spindle",
                "512k write QD16 MB/s / Ceph",
                "512k read QD16 MB/s / Ceph",
                "4k randwrite QD16 IOPS / nbdkit memory",
                "4k randread QD16 IOPS / nbdkit memory",
                "4k randread QD1 clat: Spindle / nbdkit memory",
                "512k read QD16 MB/s / disk",
                "512k write QD16 MB/s / (disk / 3)",
            ]
        );
        let nbdkit_lat = find(&t, "4k randread QD1 clat: Spindle / nbdkit memory");
        // 250 µs against nbdkit's 100: 2.5x, allowed up to 3x.
        assert_eq!(
            nbdkit_lat.map(|c| (c.value, c.bound, c.met)),
            Some((2.5, Bound::AtMost, true))
        );
        // 500 MB/s against a disk of 1000: 0.5 < 0.9.
        let read = find(&t, "512k read QD16 MB/s / disk");
        assert_eq!(read.map(|c| (c.value, c.met)), Some((0.5, false)));
        // Write: 500 / (1000 / 3) = 1.5 >= 0.7.
        let write = find(&t, "512k write QD16 MB/s / (disk / 3)");
        assert_eq!(write.map(|c| (c.value, c.met)), Some((1.5, true)));
        let ceph = find(&t, "4k randwrite QD16 IOPS / Ceph");
        assert_eq!(
            ceph.map(|c| (c.value, c.required, c.met)),
            Some((5.0, 5.0, true))
        );
    }

    /// Without a same-sitting Ceph there is no target against Ceph, and without nbdkit
    /// or disk figures none against those.
    #[test]
    fn targets_need_measured_anchors() {
        let rows = quick_rows(|_| figures(5000.0, 500.0, 250.0, 1000.0), false);
        let t = targets(
            &rows,
            TargetContext {
                pool: REPLICATED,
                ceph_same_sitting: false,
            },
        );
        assert!(t.iter().all(|c| !c.name.contains("Ceph")), "{t:?}");
        assert_eq!(t.len(), 5);
        let bare: Vec<Row> = points(true)
            .into_iter()
            .map(|p| Row::new(p, measured(figures(1.0, 1.0, 1.0, 1.0)), None, None, None))
            .collect();
        let t = targets(
            &bare,
            TargetContext {
                pool: REPLICATED,
                ceph_same_sitting: true,
            },
        );
        assert!(t.is_empty(), "{t:?}");
    }

    /// Erasure-coded pool: >= 2x Ceph EC 2+1 on every quick point (latency at QD1), p99
    /// <= 10x mean on every quick point, write target over disk / 1.5.
    #[test]
    fn ec_targets() {
        // 4k randread QD1 has a long tail (p99 12x its mean) and is slower than 2x Ceph.
        let rows = quick_rows(
            |p| {
                if p.is("4k", "randread", 1) {
                    figures(1500.0, 6.0, 600.0, 7200.0)
                } else {
                    figures(3000.0, 300.0, 300.0, 900.0)
                }
            },
            true,
        );
        let t = targets(
            &rows,
            TargetContext {
                pool: EC21,
                ceph_same_sitting: true,
            },
        );
        let ceph: Vec<&TargetCheck> = t
            .iter()
            .filter(|c| c.name.contains("Ceph EC 2+1"))
            .collect();
        assert_eq!(ceph.len(), QUICK.len());
        assert!(ceph
            .iter()
            .all(|c| c.required == 2.0 && c.bound == Bound::AtLeast));
        let slow = find(&t, "4k randread QD1 latency: Ceph EC 2+1 / Spindle");
        assert_eq!(
            slow.map(|c| (c.value, c.met)),
            Some((1000.0 / 600.0, false))
        );
        let fast = find(&t, "4k randwrite QD16 IOPS / Ceph EC 2+1");
        assert_eq!(fast.map(|c| (c.value, c.met)), Some((3.0, true)));
        let tails: Vec<&TargetCheck> = t
            .iter()
            .filter(|c| c.name.ends_with("p99 / mean clat"))
            .collect();
        assert_eq!(tails.len(), QUICK.len());
        let tail = find(&t, "4k randread QD1 p99 / mean clat");
        assert_eq!(
            tail.map(|c| (c.value, c.bound, c.met)),
            Some((12.0, Bound::AtMost, false))
        );
        let write = find(&t, "512k write QD16 MB/s / (disk / 1.5)");
        assert_eq!(write.map(|c| c.value), Some(0.3 * 1.5));
        // Published EC figures give no Ceph target, the tail targets stay.
        let t = targets(
            &rows,
            TargetContext {
                pool: EC21,
                ceph_same_sitting: false,
            },
        );
        assert!(t.iter().all(|c| !c.name.contains("Ceph")));
        assert_eq!(
            t.iter()
                .filter(|c| c.name.ends_with("p99 / mean clat"))
                .count(),
            QUICK.len()
        );
    }
}
