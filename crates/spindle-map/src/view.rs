//! [`MapView`]: a decoded map with its placement computed and its encoding kept, as every
//! map follower (storage daemon, client) holds it; and [`MapView::accept`], the one rule by
//! which a follower takes a map it is sent.

use crate::{ClusterMap, MapDecodeError, Placement};
use std::sync::Arc;

/// A map as a follower uses it.
#[derive(Debug)]
pub struct MapView {
    pub map: ClusterMap,
    /// Placement of every group, computed once per epoch.
    pub placement: Placement,
    /// The encoding it came in (sent on to peers that lag behind).
    pub encoded: Arc<Vec<u8>>,
}

/// Why a follower refuses a map it was sent.
#[derive(Debug, thiserror::Error)]
pub enum MapRejected {
    #[error("rejecting a map that does not decode: {0}")]
    Decode(#[from] MapDecodeError),
    #[error("rejecting map of cluster {theirs:016x} (mine is {mine:016x})")]
    OtherCluster { mine: u64, theirs: u64 },
}

impl MapView {
    /// Decodes `bytes` (validated by [`ClusterMap::decode`]) and computes its placement.
    pub fn decode(bytes: &[u8]) -> Result<MapView, MapRejected> {
        let map = ClusterMap::decode(bytes)?;
        Ok(MapView {
            placement: Placement::compute(&map),
            map,
            encoded: Arc::new(bytes.to_vec()),
        })
    }

    /// What a follower holding `current` does with `bytes` it was sent: `Ok(Some(view))`
    /// to install (a newer epoch of the same cluster), `Ok(None)` to ignore (not newer:
    /// epochs never go back), an error for a map of another cluster or one that does not
    /// decode. The epoch is compared before placement is computed.
    pub fn accept(current: Option<&MapView>, bytes: &[u8]) -> Result<Option<MapView>, MapRejected> {
        let map = ClusterMap::decode(bytes)?;
        if let Some(cur) = current {
            if cur.map.cluster_id != map.cluster_id {
                return Err(MapRejected::OtherCluster {
                    mine: cur.map.cluster_id,
                    theirs: map.cluster_id,
                });
            }
            if map.epoch <= cur.map.epoch {
                return Ok(None);
            }
        }
        Ok(Some(MapView {
            placement: Placement::compute(&map),
            map,
            encoded: Arc::new(bytes.to_vec()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{embedded_crush_map, OsdInfo, FULL_RATIO_PPM_DEFAULT, NEARFULL_RATIO_PPM_DEFAULT};

    fn map(cluster_id: u64, epoch: u64) -> Vec<u8> {
        let ids = [0, 1, 2];
        ClusterMap {
            cluster_id,
            epoch,
            osds: ids.iter().map(|&id| (id, OsdInfo::joining(id))).collect(),
            pools: Default::default(),
            crush: embedded_crush_map(&ids).expect("crush map"),
            nearfull_ratio_ppm: NEARFULL_RATIO_PPM_DEFAULT,
            full_ratio_ppm: FULL_RATIO_PPM_DEFAULT,
            image_locks: Default::default(),
            fenced: Default::default(),
            image_snaps: Default::default(),
        }
        .encode()
    }

    #[test]
    fn a_follower_takes_newer_maps_of_its_cluster_only() {
        let first = MapView::accept(None, &map(7, 3))
            .expect("decodes")
            .expect("newer");
        assert_eq!(first.map.epoch, 3);
        assert_eq!(*first.encoded, map(7, 3));
        // Same or older epoch: ignored, never an error.
        assert!(MapView::accept(Some(&first), &map(7, 3))
            .expect("ok")
            .is_none());
        assert!(MapView::accept(Some(&first), &map(7, 2))
            .expect("ok")
            .is_none());
        let next = MapView::accept(Some(&first), &map(7, 4))
            .expect("ok")
            .expect("newer");
        assert_eq!(next.map.epoch, 4);
        // Another cluster, even newer: refused.
        match MapView::accept(Some(&first), &map(8, 9)) {
            Err(MapRejected::OtherCluster { mine: 7, theirs: 8 }) => {}
            other => panic!("expected OtherCluster, got {other:?}"),
        }
        // Garbage: a decode error, never a panic.
        assert!(matches!(
            MapView::accept(Some(&first), b"not a map"),
            Err(MapRejected::Decode(_))
        ));
        assert!(MapView::decode(&map(7, 1)).is_ok());
    }
}
