//! Ceph 16's published figures (`shared/baselines/ceph.md`), measured on another machine
//! kind: the rows carry them when `--ceph` was not given, labelled as such; no target is
//! computed against them.

use super::{Figures, Point};

/// Ceph 16.2.15 RBD, replicated x3, 3 BlueStore OSDs on 127.0.0.1, fio 3.33 `rbd` engine,
/// numjobs 1, 10 s after 3 s ramp. Source: `/work/shared/baselines/ceph.md`, "Appendix:
/// every matrix point" rows "Ceph RBD replicated x3" (measured 2026-11-22).
/// (bs, rw, iodepth, IOPS, MB/s, mean clat µs, p99 clat µs)
pub(super) const CEPH_REP3: [(&str, &str, u32, f64, f64, f64, f64); 32] = [
    ("4k", "read", 1, 503.0, 2.1, 1893.2, 10289.2),
    ("4k", "write", 1, 196.0, 0.8, 5001.5, 13434.9),
    ("4k", "randread", 1, 1157.0, 4.7, 802.3, 2867.2),
    ("4k", "randwrite", 1, 121.0, 0.5, 8038.1, 21364.7),
    ("64k", "read", 1, 634.0, 41.6, 1495.4, 6193.2),
    ("64k", "write", 1, 254.0, 16.7, 3856.4, 8847.4),
    ("64k", "randread", 1, 947.0, 62.0, 1017.2, 3129.3),
    ("64k", "randwrite", 1, 156.0, 10.2, 6235.2, 17432.6),
    ("128k", "read", 1, 774.0, 101.4, 1233.5, 5996.5),
    ("128k", "write", 1, 240.0, 31.4, 4071.7, 9764.9),
    ("128k", "randread", 1, 407.0, 53.4, 2309.2, 8716.3),
    ("128k", "randwrite", 1, 232.0, 30.5, 4202.5, 8159.2),
    ("512k", "read", 1, 444.0, 232.6, 2209.7, 6848.5),
    ("512k", "write", 1, 177.0, 92.7, 5489.8, 11075.6),
    ("512k", "randread", 1, 443.0, 232.5, 2211.8, 5996.5),
    ("512k", "randwrite", 1, 155.0, 81.2, 6265.2, 13434.9),
    ("4k", "read", 16, 3591.0, 14.7, 4412.1, 11993.1),
    ("4k", "write", 16, 2492.0, 10.2, 6399.5, 13303.8),
    ("4k", "randread", 16, 3521.0, 14.4, 4494.7, 16056.3),
    ("4k", "randwrite", 16, 626.0, 2.6, 25444.2, 55312.4),
    ("64k", "read", 16, 1273.0, 83.5, 12497.5, 36962.3),
    ("64k", "write", 16, 1317.0, 86.4, 12102.7, 22151.2),
    ("64k", "randread", 16, 1970.0, 129.2, 8058.2, 25559.0),
    ("64k", "randwrite", 16, 450.0, 29.6, 35335.9, 77070.3),
    ("128k", "read", 16, 1520.0, 199.4, 10464.8, 28966.9),
    ("128k", "write", 16, 685.0, 90.0, 23281.8, 47972.4),
    ("128k", "randread", 16, 1937.0, 254.0, 8209.1, 23199.7),
    ("128k", "randwrite", 16, 440.0, 57.9, 36092.4, 76021.8),
    ("512k", "read", 16, 601.0, 315.8, 26524.1, 83361.8),
    ("512k", "write", 16, 362.0, 190.4, 43896.6, 76021.8),
    ("512k", "randread", 16, 797.0, 418.7, 20013.8, 60031.0),
    ("512k", "randwrite", 16, 323.0, 170.0, 48889.9, 99090.4),
];

/// Ceph 16.2.15 RBD on an erasure-coded 2+1 data pool, same setup and columns as
/// `CEPH_REP3`. Source: `/work/shared/baselines/ceph.md`, "Appendix: every matrix point"
/// rows "Ceph RBD EC 2+1" (IOPS, MB/s, mean and p99 clat), measured 2026-11-22.
pub(super) const CEPH_EC21: [(&str, &str, u32, f64, f64, f64, f64); 32] = [
    ("4k", "read", 1, 1004.0, 4.1, 960.3, 2703.4),
    ("4k", "write", 1, 101.0, 0.4, 9728.6, 25034.8),
    ("4k", "randread", 1, 668.0, 2.7, 1442.5, 4948.0),
    ("4k", "randwrite", 1, 144.0, 0.6, 6771.5, 13303.8),
    ("64k", "read", 1, 280.0, 18.4, 3428.3, 13041.7),
    ("64k", "write", 1, 160.0, 10.5, 6114.5, 14876.7),
    ("64k", "randread", 1, 300.0, 19.6, 3191.6, 9240.6),
    ("64k", "randwrite", 1, 109.0, 7.2, 8940.9, 23199.7),
    ("128k", "read", 1, 677.0, 88.8, 1438.9, 4554.8),
    ("128k", "write", 1, 194.0, 25.4, 5010.2, 10420.2),
    ("128k", "randread", 1, 682.0, 89.4, 1430.8, 3457.0),
    ("128k", "randwrite", 1, 144.0, 18.9, 6742.3, 14483.5),
    ("512k", "read", 1, 423.0, 221.8, 2318.8, 5668.9),
    ("512k", "write", 1, 174.0, 91.0, 5522.8, 9502.7),
    ("512k", "randread", 1, 372.0, 195.2, 2634.7, 5865.5),
    ("512k", "randwrite", 1, 142.0, 74.2, 6760.5, 12910.6),
    ("4k", "read", 16, 1600.0, 6.6, 9941.3, 26869.8),
    ("4k", "write", 16, 1778.0, 7.3, 8978.7, 19529.7),
    ("4k", "randread", 16, 1335.0, 5.5, 11924.0, 36962.3),
    ("4k", "randwrite", 16, 307.0, 1.3, 51866.4, 108527.6),
    ("64k", "read", 16, 941.0, 61.7, 16925.1, 42729.5),
    ("64k", "write", 16, 1199.0, 78.7, 13301.0, 25296.9),
    ("64k", "randread", 16, 1343.0, 88.1, 11855.8, 38535.2),
    ("64k", "randwrite", 16, 340.0, 22.4, 46770.1, 107479.0),
    ("128k", "read", 16, 1100.0, 144.4, 14470.1, 35389.4),
    ("128k", "write", 16, 927.0, 121.7, 17201.1, 34865.2),
    ("128k", "randread", 16, 1169.0, 153.4, 13631.8, 40108.0),
    ("128k", "randwrite", 16, 332.0, 43.7, 47844.6, 120062.0),
    ("512k", "read", 16, 630.0, 331.3, 25284.7, 59506.7),
    ("512k", "write", 16, 346.0, 182.2, 45968.7, 99090.4),
    ("512k", "randread", 16, 682.0, 358.2, 23423.6, 62128.1),
    ("512k", "randwrite", 16, 242.0, 127.5, 65317.4, 130547.7),
];

/// Ceph's published figures at a point (another machine kind).
pub(super) fn published_ceph(p: &Point, erasure: bool) -> Option<Figures> {
    let table = if erasure { &CEPH_EC21 } else { &CEPH_REP3 };
    table.iter().find(|(bs, rw, qd, ..)| p.is(bs, rw, *qd)).map(
        |&(_, _, _, iops, mb_per_s, clat_mean_us, clat_p99_us)| Figures {
            iops,
            mb_per_s,
            clat_mean_us,
            clat_p99_us,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::points;
    use super::*;

    /// Both Ceph tables have every point of the matrix exactly once.
    #[test]
    fn ceph_tables_cover_the_matrix() {
        for (name, table) in [("rep3", &CEPH_REP3), ("ec21", &CEPH_EC21)] {
            for p in points(false) {
                let n = table
                    .iter()
                    .filter(|(bs, rw, qd, ..)| p.is(bs, rw, *qd))
                    .count();
                assert_eq!(n, 1, "{name}: {} appears {n} times", p.label());
            }
        }
        // Spot checks against shared/baselines/ceph.md.
        let ec = |bs: &str, rw: &str, qd: u32| {
            published_ceph(
                &Point {
                    bs: bs.into(),
                    rw: rw.into(),
                    iodepth: qd,
                },
                true,
            )
            .map(|f| (f.iops, f.mb_per_s))
        };
        assert_eq!(ec("4k", "randwrite", 16), Some((307.0, 1.3)));
        assert_eq!(ec("512k", "write", 16), Some((346.0, 182.2)));
        assert_eq!(ec("4k", "randread", 16), Some((1335.0, 5.5)));
    }
}
