//! Spreading a sidecar's several Leases over its group: one task follows
//! what each Lease's election publishes and tells every election what this
//! process holds of the others ([`Spread`]). The rules themselves (who
//! claims, how soon a free Lease is taken, which Lease is given up) live in
//! the elector (`elector::machine::spread`); this only connects them.

use futures::future::select_all;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::elector::machine::{Held, Spread, spread_of};
use crate::serve::published::LeaderState;

/// Starts the coordinator of `identity`'s `states` (one per Lease, in
/// their order), telling each election through its sender in `spreads`;
/// the task ends once an election has ended (they end together, at
/// shutdown).
pub fn spawn(
    identity: String,
    states: Vec<watch::Receiver<LeaderState>>,
    spreads: Vec<watch::Sender<Spread>>,
) -> JoinHandle<()> {
    tokio::spawn(coordinate(identity, states, spreads))
}

async fn coordinate(
    identity: String,
    mut states: Vec<watch::Receiver<LeaderState>>,
    senders: Vec<watch::Sender<Spread>>,
) {
    loop {
        let now: Vec<LeaderState> = states
            .iter_mut()
            .map(|state| state.borrow_and_update().clone())
            .collect();
        let held: Vec<Held<'_>> = now
            .iter()
            .map(|state| Held {
                leading: state.leading,
                holder: state.holder.as_deref(),
                successor: state.successor.as_deref(),
                own_record: state.own_record,
            })
            .collect();
        for (sender, spread) in senders.iter().zip(spread_of(&held, &identity)) {
            // Only a change wakes the election.
            sender.send_if_modified(|current| {
                let changed = *current != spread;
                *current = spread;
                changed
            });
        }
        let changes = states.iter_mut().map(|state| Box::pin(state.changed()));
        let (changed, _, _) = select_all(changes).await;
        if changed.is_err() {
            // An election ended (shutdown): the others are ending too.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(leading: bool) -> LeaderState {
        LeaderState {
            leading,
            holder: leading.then(|| "me".into()),
            own_record: leading,
            ..LeaderState::initial()
        }
    }

    #[tokio::test]
    async fn each_election_hears_what_the_process_holds_of_the_others() {
        let (tx_a, rx_a) = watch::channel(state(false));
        let (tx_b, rx_b) = watch::channel(state(false));
        let (senders, mut spreads): (Vec<_>, Vec<_>) =
            (0..2).map(|_| watch::channel(Spread::default())).unzip();
        let task = spawn("me".into(), vec![rx_a, rx_b], senders);
        assert_eq!(*spreads[0].borrow(), Spread::default());
        tx_a.send_modify(|s| *s = state(true));
        spreads[1].changed().await.unwrap();
        assert_eq!(spreads[1].borrow_and_update().held_elsewhere, 1);
        assert_eq!(*spreads[0].borrow(), Spread::default());
        // Both held, a pod holding none named in the second: it is surplus.
        tx_b.send_modify(|s| {
            *s = LeaderState {
                successor: Some("c".into()),
                ..state(true)
            }
        });
        spreads[1].changed().await.unwrap();
        let second = *spreads[1].borrow_and_update();
        assert!(second.surplus, "{second:?}");
        spreads[0].changed().await.unwrap();
        let first = *spreads[0].borrow_and_update();
        assert_eq!((first.held_elsewhere, first.surplus), (1, false));
        // The first released (c named in it, about to take it): one held,
        // nothing to give up.
        tx_a.send_modify(|s| {
            *s = LeaderState {
                successor: Some("c".into()),
                ..state(false)
            }
        });
        spreads[1].changed().await.unwrap();
        assert_eq!(*spreads[1].borrow_and_update(), Spread::default());
        // An election that ends ends the coordinator.
        drop(tx_a);
        task.await.unwrap();
        drop(tx_b);
    }
}
