//! Locking policy of the cluster crates.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also when a thread panicked while holding it. A poisoned lock means a bug
/// panicked mid-update; a storage process keeps serving with the last state (every
/// structure behind these locks is left consistent between statements that can panic,
/// and the panic itself is logged) instead of turning one bug into a dead daemon.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_poisoned_lock_still_locks() {
        let m = std::sync::Arc::new(std::sync::Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *super::lock(&m) += 1;
        assert_eq!(*super::lock(&m), 2);
    }
}
