//! `report --review` end to end with the embedded assistant (the tiny model's words are noise;
//! the selection, files and page entries are what is checked): every rewarded trial with a hack
//! signal and the sampled others get a verdict in review.md, review.csv and on their page.

use crate::common::lego;
use crate::report::{chromium, dump_dom, enc};
use crate::synth::{trajectory, write_run, Synth};

#[test]
fn rewarded_trials_with_signals_and_a_sample_are_reviewed_into_files_and_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let s = Synth {
        steps: 1,
        // Step 0's rewarded trials are 8 of 16; trajectories 4, 8, 10 and 14 get a signal.
        hack_every: 2,
        ..Default::default()
    };
    write_run(&run, &s);
    let all: Vec<_> = (0..16)
        .map(|i| trajectory(&s, 0, i / 4, (i % 4) as u32, i))
        .collect();
    let rewarded = |t: &&lego_rl::records::Trajectory| t.reward.is_some_and(|r| r > 0.0);
    let signalled: Vec<&str> = all
        .iter()
        .filter(rewarded)
        .filter(|t| t.audit.iter().any(|a| a.kind.starts_with("hack_")))
        .map(|t| t.id.as_str())
        .collect();
    let others = all.iter().filter(rewarded).count() - signalled.len();
    assert!(!signalled.is_empty() && others >= 2);
    let out = dir.path().join("report");
    let o = lego()
        .arg("report")
        .arg(&run)
        .arg("-o")
        .arg(&out)
        .arg("--review")
        .arg("--review-sample=2")
        .arg(format!(
            "--assistant=embedded:{}",
            crate::model::tiny_moe().display()
        ))
        .arg(format!(
            "--assistant-chat-model={}",
            crate::rollout::chat_dir().display()
        ))
        .args(["--assistant-context=2048", "--assistant-max-tokens=8"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let mut csv = csv::Reader::from_path(out.join("review.csv")).unwrap();
    let rows: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), signalled.len() + 2, "{rows:?}");
    for r in &rows {
        let (id, signals, why, verdict, answered) = (&r[0], &r[5], &r[6], &r[7], &r[9]);
        assert!(["earned", "hack", "unsure"].contains(&verdict), "{r:?}");
        assert_eq!(answered, "true", "{r:?}");
        if signalled.contains(&id) {
            assert_eq!((why, signals), ("signal", "hack_skip"), "{r:?}");
        } else {
            assert_eq!((why, signals), ("sample", ""), "{r:?}");
        }
    }
    let md = std::fs::read_to_string(out.join("review.md")).unwrap();
    assert!(
        md.contains(&format!("{} trials reviewed by embedded", rows.len())),
        "{md}"
    );
    assert!(
        md.contains(&format!("(index.html#traj={})", signalled[0])),
        "{md}"
    );
    let Some(chrome) = chromium() else { return };
    let url = format!(
        "file://{}#traj={}",
        out.join("index.html").display(),
        enc(signalled[0])
    );
    let dom = dump_dom(&chrome, &dir.path().join("profile"), &url);
    assert!(
        dom.contains("id=\"review-verdict\""),
        "the verdict is on the page"
    );
    assert!(
        dom.contains("reviewed for: signal; signals: hack_skip"),
        "{}",
        &dom[dom.find("id=\"review\"").unwrap_or(0)..][..400.min(dom.len())]
    );
}
