//! Settings a config reload changes while the daemon runs: each part holds a [`Live`] of its setting and
//! reads it when it acts, so a reload needs no restart and no lock shared with the reloader.

use tokio::sync::watch;

/// A setting's current value; clones follow the same [`Setter`].
#[derive(Debug, Clone)]
pub struct Live<T>(watch::Receiver<T>);

impl<T: Clone> Live<T> {
    /// A value nothing changes (tests, and parts built outside the daemon).
    pub fn fixed(value: T) -> Self {
        Self(watch::channel(value).1)
    }

    /// The value now.
    pub fn get(&self) -> T {
        self.0.borrow().clone()
    }
}

/// Where a reload sets a setting.
#[derive(Debug)]
pub struct Setter<T>(watch::Sender<T>);

impl<T: Clone + PartialEq> Setter<T> {
    /// A setting starting at `value`, and its first reader.
    pub fn new(value: T) -> (Self, Live<T>) {
        let (tx, rx) = watch::channel(value);
        (Self(tx), Live(rx))
    }

    /// Another reader of the same setting.
    pub fn live(&self) -> Live<T> {
        Live(self.0.subscribe())
    }

    /// Sets the value; true when it differed.
    pub fn set(&self, value: T) -> bool {
        self.0.send_if_modified(|current| {
            let changed = *current != value;
            if changed {
                *current = value;
            }
            changed
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reader_sees_a_set_value_and_set_says_whether_it_changed() {
        let (setter, first) = Setter::new(1);
        let second = setter.live();
        assert!(!setter.set(1), "same value");
        assert!(setter.set(2));
        assert_eq!((first.get(), second.get()), (2, 2));
        assert_eq!(Live::fixed(7).get(), 7);
    }
}
