//! The conformance checks every storage backend passes (SQLite in the
//! tests, ClickHouse and object storage through `whyslow server
//! check-store`): what the server relies on of a store, as one function.

use crate::{
    now_unix, BatchKind, FunctionQuery, FunctionTable, Order, ProfileMeta, Store, StoredProfile,
    TenantId,
};

/// A conformance check: the condition, or the error naming it.
macro_rules! check {
    ($cond:expr) => {
        if !$cond {
            return Err(format!("conformance check failed: {}", stringify!($cond)));
        }
    };
}

/// A store call that must succeed in a conformance check.
macro_rules! ok {
    ($e:expr) => {
        $e.map_err(|e| format!("conformance: {}: {e}", stringify!($e)))?
    };
}

/// The conformance checks every backend must pass (run by the tests on
/// SQLite and by `whyslow server check-store` on any backend), on a fresh,
/// empty store: the first failure, named by its check.
pub fn conformance(s: &dyn Store) -> Result<(), String> {
    let ta = ok!(s.create_token("team-a"));
    let ta2 = ok!(s.create_token("team-a"));
    let tb = ok!(s.create_token("team-b"));
    check!(ta != ta2);
    let a = ok!(s.tenant_of_token(&ta)).ok_or("conformance: a new token has no tenant")?;
    check!(ok!(s.tenant_of_token(&ta2)) == Some(a));
    let b = ok!(s.tenant_of_token(&tb)).ok_or("conformance: a new token has no tenant")?;
    check!(a != b);
    check!(ok!(s.tenant_of_token("wsk_nope")).is_none());
    ok!(s.put_fingerprint(a, "job1", "s1", 1, "{\"w\":1}"));
    ok!(s.put_fingerprint(a, "job1", "s1", 0, "{\"w\":0}"));
    ok!(s.put_fingerprint(a, "job1", "s1", 1, "{\"w\":1,\"again\":'yes'}"));
    check!(ok!(s.fingerprints(a, "job1", "s1")) == vec!["{\"w\":0}", "{\"w\":1,\"again\":'yes'}"]);
    // Tenant b sees nothing of tenant a's, even by name.
    check!(ok!(s.fingerprints(b, "job1", "s1")).is_empty());
    check!(!ok!(s.has_job(b, "job1")));
    check!(ok!(s.jobs(b)).is_empty());
    let jobs = ok!(s.jobs(a));
    check!(jobs.len() == 1);
    check!((jobs[0].sessions, jobs[0].fingerprints) == (1, 2));
    ok!(s.put_fingerprint(a, "job1", "s2", 0, "{\"w\":0}"));
    let sessions = ok!(s.sessions(a, "job1"));
    let mut names: Vec<_> = sessions
        .iter()
        .map(|x| (x.session.as_str(), x.fingerprints))
        .collect();
    names.sort();
    check!(names == vec![("s1", 2), ("s2", 1)]);
    check!(ok!(s.sessions(b, "job1")).is_empty());
    check!(ok!(s.sessions(a, "no-such-job")).is_empty());
    conformance_profiles(s, a, b)?;
    conformance_batches(s, a, b)?;
    conformance_functions(s, a, b)
}

/// [`conformance`]'s part for stack profiles: a batch is stored once,
/// newest first, per tenant, the same back as in, merged, counted, and the
/// hour profiles (baselines) the same before and after compaction.
fn conformance_profiles(s: &dyn Store, a: TenantId, b: TenantId) -> Result<(), String> {
    // Profiles: a batch is stored once; newest first; per tenant; what
    // comes back is the profile that went in.
    let totals = |ps: Vec<StoredProfile>| -> Vec<u64> {
        ps.into_iter()
            .map(|p| p.into_profile(1 << 24).map_or(0, |p| p.total()))
            .collect()
    };
    let (one, two) = (work(1, &[("x", 1)]), work(2, &[("y", 2), ("z", 1)]));
    check!(ok!(s.put_profile(a, "job2", &meta("b1", 1), &one)));
    check!(ok!(s.put_profile(a, "job2", &meta("b2", 2), &two)));
    check!(!ok!(s.put_profile(a, "job2", &meta("b1", 1), &one)));
    check!(totals(ok!(s.profiles(a, "job2", "cpu", 10))) == vec![3, 1]);
    // The same stacks, counts, period, rate and labels (frames may be
    // interned in another order).
    let canonical = |p: whyslow_model::stack::StackProfile| {
        let stacks: std::collections::BTreeMap<Vec<whyslow_model::stack::Frame>, u64> = p
            .stacks
            .iter()
            .map(|st| {
                let fs = st
                    .frames
                    .iter()
                    .filter_map(|&i| p.frames.get(i as usize).cloned());
                (fs.collect(), st.count)
            })
            .collect();
        (
            stacks,
            p.hz.to_bits(),
            p.start_unix_ns,
            p.duration_ns,
            p.labels,
        )
    };
    check!(
        ok!(s.profiles(a, "job2", "cpu", 1))
            .pop()
            .and_then(|p| p.into_profile(1 << 24))
            .map(canonical)
            == whyslow_codec::from_pprof_limited(&two, 1 << 24)
                .ok()
                .map(canonical)
    );
    check!(
        totals(ok!(s.profiles_in_order(
            a,
            "job2",
            "cpu",
            1,
            Order::OldestFirst
        ))) == vec![1]
    );
    check!(
        ok!(s.merged_profiles(a, "job2", "cpu", 10, Order::NewestFirst))
            .map(|(p, n)| (p.total(), n))
            == Some((4, 2))
    );
    check!(
        ok!(s.merged_profiles(a, "job2", "cpu", 1, Order::OldestFirst))
            .map(|(p, n)| (p.total(), n))
            == Some((1, 1))
    );
    check!(ok!(s.merged_profiles(b, "job2", "cpu", 10, Order::NewestFirst)).is_none());
    check!(ok!(s.profile_count(a, "job2", "cpu")) == 2);
    check!(ok!(s.profile_count(a, "job2", "offcpu")) == 0);
    check!(ok!(s.profile_count(b, "job2", "cpu")) == 0);
    check!(ok!(s.profiles(a, "job2", "offcpu", 10)).is_empty());
    check!(ok!(s.profiles(b, "job2", "cpu", 10)).is_empty());
    check!(ok!(s.has_job(a, "job2")) && !ok!(s.has_job(b, "job2")));
    let jobs = ok!(s.jobs(a));
    let job2 = jobs
        .iter()
        .find(|j| j.job == "job2")
        .ok_or("conformance: job2 is not listed")?;
    check!((job2.sessions, job2.fingerprints, job2.profiles) == (0, 0, 2));
    check!(s.put_profile(a, "job2", &meta("../x", 3), b"x").is_err());
    conformance_hours(s, a, b)
}

/// [`conformance`]'s part for hour profiles (baselines).
fn conformance_hours(s: &dyn Store, a: TenantId, b: TenantId) -> Result<(), String> {
    // Hour profiles (baselines): the profiles that began in one hour,
    // merged, the same before and after the store's compaction, and a late
    // profile counted once it is there. A few hours ago: within retention.
    let hour = (now_unix() / 3600 - 3) * 3600;
    let at = |s: i64| (hour + s) * 1_000_000_000;
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h1", at(10)),
        &work(hour + 10, &[("a", 3)])
    )));
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h2", at(20)),
        &work(hour + 20, &[("a", 2), ("b", 5)])
    )));
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h0", at(-5)),
        &work(hour - 5, &[("c", 7)])
    )));
    let total = |s: &dyn Store| -> Result<Option<u64>, String> {
        Ok(ok!(s.hour_profile(a, "job-h", "cpu", hour)).map(|p| p.total()))
    };
    check!(total(s)? == Some(10));
    check!(ok!(s.hour_profile(a, "job-h", "cpu", hour + 3600)).is_none());
    check!(ok!(s.hour_profile(a, "job-h", "offcpu", hour)).is_none());
    check!(ok!(s.hour_profile(b, "job-h", "cpu", hour)).is_none());
    // The embedded store moves them into a segment: the same answer.
    ok!(s.compact(now_unix() + 1));
    check!(total(s)? == Some(10));
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h3", at(30)),
        &work(hour + 30, &[("b", 1)])
    )));
    check!(!ok!(s.put_profile(
        a,
        "job-h",
        &meta("h3", at(30)),
        &work(hour + 30, &[("b", 1)])
    )));
    check!(total(s)? == Some(11));
    ok!(s.compact(now_unix() + 1));
    check!(total(s)? == Some(11));
    let names = |p: whyslow_model::stack::StackProfile| {
        let mut n: Vec<String> = p.frames.iter().filter_map(|f| f.name.clone()).collect();
        n.sort();
        n
    };
    check!(
        ok!(s.hour_profile(a, "job-h", "cpu", hour)).map(names)
            == Some(vec!["a".into(), "b".into(), "main".into()])
    );
    Ok(())
}

/// [`conformance`]'s part for text batches and names.
fn conformance_batches(s: &dyn Store, a: TenantId, b: TenantId) -> Result<(), String> {
    // Text batches of every kind (collective records, OS readings, flow
    // analyses, hang reports): a batch once, newest first, per tenant, per
    // kind; bodies as uploaded (JSON lines keep their newlines).
    for (i, kind) in BatchKind::ALL.into_iter().enumerate() {
        let job = format!("job-b{i}");
        let (one, two) = (
            format!("{{\"k\":{i},\"n\":1}}\n"),
            format!("{{\"k\":{i},\"n\":2}}\n"),
        );
        check!(ok!(s.put_batch(a, &job, kind, "x1", &one)));
        check!(ok!(s.put_batch(a, &job, kind, "x2", &two)));
        check!(!ok!(s.put_batch(a, &job, kind, "x1", &one)));
        check!(ok!(s.batches(a, &job, kind, 10)) == vec![two.clone(), one.clone()]);
        check!(ok!(s.batches(a, &job, kind, 1)) == vec![two.clone()]);
        check!(ok!(s.batches(b, &job, kind, 10)).is_empty());
        check!(ok!(s.has_job(a, &job)) && !ok!(s.has_job(b, &job)));
        // A job with only batches (a hang report, a flow analysis) is listed.
        let listed = ok!(s.jobs(a));
        let row = listed
            .iter()
            .find(|j| j.job == job)
            .ok_or("conformance: a job with only batches is not listed")?;
        check!((row.sessions, row.fingerprints, row.profiles) == (0, 0, 0));
        check!(row.updated_unix_s > 0);
        check!(!ok!(s.jobs(b)).iter().any(|j| j.job == job));
        check!(s.put_batch(a, &job, kind, "../x", "{}").is_err());
        for other in BatchKind::ALL.into_iter().filter(|&k| k != kind) {
            check!(ok!(s.batches(a, &job, other, 10)).is_empty());
        }
    }
    for bad in ["", "../x", ".hidden", "a/b", "a'b", &"x".repeat(201)] {
        check!(s.put_fingerprint(a, bad, "s1", 0, "{}").is_err());
    }
    Ok(())
}

/// [`conformance`]'s part for [`Store::functions`]: self and total per
/// function across jobs, a job filter, a baseline, isolation.
fn conformance_functions(s: &dyn Store, a: TenantId, b: TenantId) -> Result<(), String> {
    use whyslow_model::stack::{Frame, FrameKind, StackProfileBuilder};
    // Two hours before the hour profiles' hour, apart from them.
    let hour = (now_unix() / 3600 - 6) * 3600;
    let native = |name: &str| Frame {
        kind: FrameKind::Native,
        name: Some(name.into()),
        module: Some("/usr/bin/train".into()),
        build_id: None,
        offset: 0x40,
        line: None,
    };
    let put = |job: &str, batch: &str, at_s: i64, stacks: &[(&[&str], u64)]| {
        let mut pb = StackProfileBuilder::new();
        for (names, n) in stacks {
            let mut ids = vec![pb.frame(Frame::label("thread"))];
            ids.extend(names.iter().map(|f| pb.frame(native(f))));
            pb.add(ids, *n);
        }
        let p = pb.finish(99.0, (at_s * 1_000_000_000) as u64, 1_000_000_000);
        let meta = ProfileMeta {
            batch: batch.into(),
            kind: "cpu".into(),
            rank: None,
            host: Some("h0".into()),
            start_unix_ns: at_s * 1_000_000_000,
            samples: p.total(),
        };
        s.put_profile(a, job, &meta, &whyslow_codec::to_pprof(&p))
    };
    check!(ok!(put(
        "job-f",
        "f1",
        hour + 10,
        &[
            (&["main", "step", "matmul"], 6),
            (&["main", "step", "allreduce"], 2)
        ]
    )));
    check!(ok!(put(
        "job-g",
        "g1",
        hour + 20,
        &[(&["main", "matmul"], 2)]
    )));
    check!(ok!(put(
        "job-f",
        "f0",
        hour - 100,
        &[
            (&["main", "step", "allreduce"], 4),
            (&["main", "step", "matmul"], 4)
        ]
    )));
    check!(!ok!(put(
        "job-f",
        "f1",
        hour + 10,
        &[
            (&["main", "step", "matmul"], 6),
            (&["main", "step", "allreduce"], 2)
        ]
    )));
    let ns = |t: i64| t * 1_000_000_000;
    let mut q = FunctionQuery {
        kind: "cpu".into(),
        jobs: vec![],
        range: (ns(hour), ns(hour + 3600)),
        baseline: Some((ns(hour - 3600), ns(hour))),
        limit: 10,
    };
    let t = ok!(s.functions(a, &q));
    check!((t.samples, t.profiles, t.base_samples, t.base_profiles) == (10, 2, Some(8), Some(1)));
    let row = |t: &FunctionTable, f: &str| {
        t.functions
            .iter()
            .find(|x| x.function == f)
            .map(|x| (x.self_samples, x.total_samples))
    };
    let order: Vec<&str> = t.functions.iter().map(|f| f.function.as_str()).collect();
    check!(order == vec!["matmul", "allreduce", "main", "step"]);
    check!(row(&t, "matmul") == Some((8, 8)) && row(&t, "allreduce") == Some((2, 2)));
    check!(row(&t, "main") == Some((0, 10)) && row(&t, "step") == Some((0, 8)));
    let matmul = &t.functions[0];
    check!(
        matmul.self_share.to_bits() == 0.8f64.to_bits() || (matmul.self_share - 0.8).abs() <= 1e-9
    );
    check!(matmul
        .base_self_share
        .is_some_and(|b| (b - 0.5).abs() < 1e-9));
    check!(matmul
        .self_share_change
        .is_some_and(|c| (c - 0.3).abs() < 1e-9));
    q.jobs = vec!["job-g".into()];
    q.baseline = None;
    q.limit = 1;
    let t = ok!(s.functions(a, &q));
    check!((t.samples, t.profiles, t.base_samples) == (2, 1, None));
    check!(t.functions.len() == 1 && row(&t, "matmul") == Some((2, 2)));
    check!(ok!(s.functions(b, &q)).samples == 0 && ok!(s.functions(b, &q)).functions.is_empty());
    q.jobs = vec!["../x".into()];
    check!(s.functions(a, &q).is_err());
    Ok(())
}

/// A CPU profile's metadata as the checks upload it.
fn meta(batch: &str, t: i64) -> ProfileMeta {
    ProfileMeta {
        batch: batch.into(),
        kind: "cpu".into(),
        rank: Some("0".into()),
        host: Some("h0".into()),
        start_unix_ns: t,
        samples: 10,
    }
}

/// A pprof profile that began at `at_s` with `main;leaf` stacks.
fn work(at_s: i64, stacks: &[(&str, u64)]) -> Vec<u8> {
    use whyslow_model::stack::{Frame, StackProfileBuilder};
    let mut b = StackProfileBuilder::new();
    for (leaf, n) in stacks {
        let ids = vec![b.frame(Frame::label("main")), b.frame(Frame::label(*leaf))];
        b.add(ids, *n);
    }
    whyslow_codec::to_pprof(&b.finish(99.0, (at_s * 1_000_000_000) as u64, 1_000_000_000))
}
