//! The funnel: per stage, how many tasks went in, came out, and why the others were dropped.
//! Written as CSV (`stage,in,out,dropped,reason,count`, one row per drop reason; a stage that
//! dropped nothing has one row with an empty reason) and printed as an aligned table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// A funnel stage, in pipeline order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Reading and parsing the inputs (bad records appear here with `--keep-going`).
    #[value(skip)]
    Ingest,
    Rules,
    Decontamination,
    Validity,
    Difficulty,
    Saturation,
}

impl Stage {
    /// The stage's name in the funnel and in decisions.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Ingest => "ingest",
            Stage::Rules => "rules",
            Stage::Decontamination => "decontamination",
            Stage::Validity => "validity",
            Stage::Difficulty => "difficulty",
            Stage::Saturation => "saturation",
        }
    }
}

/// Counts of one stage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StageCount {
    pub input: u64,
    pub output: u64,
    /// Drop reason → count.
    pub reasons: BTreeMap<String, u64>,
}

impl StageCount {
    /// Tasks dropped by this stage.
    pub fn dropped(&self) -> u64 {
        self.input - self.output
    }
}

/// The whole funnel, stages in pipeline order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Funnel {
    pub stages: Vec<(Stage, StageCount)>,
}

impl Funnel {
    /// A funnel over the given (enabled) stages; `ingest` always comes first.
    pub fn new(stages: &[Stage]) -> Self {
        let mut all = vec![(Stage::Ingest, StageCount::default())];
        all.extend(stages.iter().map(|s| (*s, StageCount::default())));
        Funnel { stages: all }
    }

    /// The counts of one stage.
    pub fn stage_mut(&mut self, stage: Stage) -> &mut StageCount {
        let i = self
            .stages
            .iter()
            .position(|(s, _)| *s == stage)
            .expect("invariant: only enabled stages are counted");
        &mut self.stages[i].1
    }

    /// The counts of one stage, if enabled.
    pub fn get(&self, stage: Stage) -> Option<&StageCount> {
        self.stages.iter().find(|(s, _)| *s == stage).map(|(_, c)| c)
    }

    /// Rows of the CSV/table: (stage, in, out, dropped, reason, count); reasons by count
    /// descending, then name.
    pub fn rows(&self) -> Vec<(&'static str, u64, u64, u64, String, u64)> {
        let mut rows = Vec::new();
        for (stage, c) in &self.stages {
            let mut reasons: Vec<(&String, &u64)> = c.reasons.iter().collect();
            reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            if reasons.is_empty() {
                rows.push((stage.as_str(), c.input, c.output, c.dropped(), String::new(), 0));
            }
            for (r, n) in reasons {
                rows.push((stage.as_str(), c.input, c.output, c.dropped(), r.clone(), *n));
            }
        }
        rows
    }

    /// The funnel as CSV bytes.
    pub fn to_csv(&self) -> Result<Vec<u8>, csv::Error> {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(["stage", "in", "out", "dropped", "reason", "count"])?;
        for (stage, i, o, d, reason, n) in self.rows() {
            w.write_record([
                stage,
                &i.to_string(),
                &o.to_string(),
                &d.to_string(),
                &reason,
                &n.to_string(),
            ])?;
        }
        w.into_inner().map_err(|e| csv::Error::from(e.into_error()))
    }

    /// The funnel as an aligned text table.
    pub fn to_table(&self) -> String {
        let header = ["stage", "in", "out", "dropped", "reason", "count"];
        let rows: Vec<[String; 6]> = self
            .rows()
            .into_iter()
            .map(|(s, i, o, d, r, n)| {
                let count = if r.is_empty() {
                    String::new()
                } else {
                    n.to_string()
                };
                [
                    s.to_string(),
                    i.to_string(),
                    o.to_string(),
                    d.to_string(),
                    r,
                    count,
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for r in &rows {
            for (w, cell) in width.iter_mut().zip(r) {
                *w = (*w).max(cell.len());
            }
        }
        let mut out = String::new();
        let mut line = |cells: [&str; 6]| {
            let _ = writeln!(
                out,
                "{:<w0$}  {:>w1$}  {:>w2$}  {:>w3$}  {:<w4$}  {:>w5$}",
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                cells[4],
                cells[5],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2],
                w3 = width[3],
                w4 = width[4],
                w5 = width[5]
            );
        };
        line(header);
        for r in &rows {
            line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
        }
        out.lines().map(str::trim_end).collect::<Vec<_>>().join("\n") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_one_row_per_reason() {
        let mut f = Funnel::new(&[Stage::Rules]);
        let c = f.stage_mut(Stage::Ingest);
        c.input = 10;
        c.output = 10;
        let r = f.stage_mut(Stage::Rules);
        r.input = 10;
        r.output = 6;
        r.reasons.insert("statement_too_short".into(), 1);
        r.reasons.insert("duplicate".into(), 3);
        let csv = String::from_utf8(f.to_csv().unwrap()).unwrap();
        assert_eq!(
            csv,
            "stage,in,out,dropped,reason,count\ningest,10,10,0,,0\nrules,10,6,4,duplicate,3\nrules,10,6,4,statement_too_short,1\n"
        );
        let table = f.to_table();
        assert_eq!(
            table,
            "stage   in  out  dropped  reason               count\n\
             ingest  10   10        0\n\
             rules   10    6        4  duplicate                3\n\
             rules   10    6        4  statement_too_short      1\n"
        );
    }
}
