//! The printed table: min / median / p99 / max per row.

use std::time::Duration;

pub struct Table {
    pub rows: Vec<String>,
}

impl Table {
    pub fn durations(
        &mut self,
        name: &str,
        goal: &str,
        values: &[Duration],
        met: impl Fn(f64) -> bool,
    ) {
        let ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        self.signed(name, goal, &ms, met);
    }

    /// `met` is judged on the p99.
    pub fn signed(&mut self, name: &str, goal: &str, values: &[f64], met: impl Fn(f64) -> bool) {
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let p99 = v[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
        let verdict = if goal.is_empty() {
            ""
        } else if met(p99) {
            "met"
        } else {
            "**not met**"
        };
        self.rows.push(format!(
            "| {name} | {n} | {:.1} | {:.1} | {:.1} | {:.1} | {goal} | {verdict} |",
            v[0],
            v[n / 2],
            p99,
            v[n - 1]
        ));
    }

    pub fn print(&self) {
        if self.rows.is_empty() {
            return;
        }
        println!("| measurement (ms) | rounds | min | median | p99 | max | goal (p99) | |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            println!("{r}");
        }
    }
}
