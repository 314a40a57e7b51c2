"""ConsumerScheduler on a fake clock: one owner per queue, balance, release, retention takeover, epochs."""

from localmq.client.scheduler import ConsumerScheduler

Q = [("T", q) for q in range(4)]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def make():
    clock = Clock()
    return ConsumerScheduler(clock=clock), clock


def owners_are_exclusive(s, group="g"):
    own = s.owners(group)
    return len(own) == len(set(own)) and all(isinstance(c, int) for c in own.values())


def test_a_lone_consumer_gets_every_queue():
    s, _ = make()
    a = s.join("g", ["T"], 1000)
    r = s.assign("g", a, Q, 1000, ["T"])
    assert sorted(r.owned) == Q and sorted(r.granted) == Q and not r.lost and not r.to_release


def test_a_second_consumer_gets_half_after_the_first_releases():
    s, _ = make()
    a = s.join("g", ["T"], 1000)
    s.assign("g", a, Q, 1000)
    b = s.join("g", ["T"], 1000)
    rb = s.assign("g", b, Q, 1000)
    assert rb.granted == []  # nothing free yet: a holds all four
    ra = s.assign("g", a, Q, 1000)
    assert len(ra.to_release) == 2  # over its share while b starves
    s.release("g", a, ra.to_release)
    rb = s.assign("g", b, Q, 1000)
    assert sorted(rb.granted) == sorted(ra.to_release)
    own = s.owners("g")
    assert sorted(own) == Q and sorted(own.values()) == [a, a, b, b]
    # stable from here on
    assert s.assign("g", a, Q, 1000).to_release == [] and s.assign("g", b, Q, 1000).granted == []


def test_more_consumers_than_queues():
    s, _ = make()
    ids = [s.join("g", ["T"], 1000) for _ in range(6)]
    for cid in ids:
        s.assign("g", cid, Q, 1000)
    for cid in ids:
        s.assign("g", cid, Q, 1000)
    own = s.owners("g")
    assert sorted(own) == Q
    assert sorted(list(own.values()).count(c) for c in ids) == [0, 0, 1, 1, 1, 1]


def test_leave_frees_queues_at_once():
    s, _ = make()
    a = s.join("g", ["T"], 1000)
    b = s.join("g", ["T"], 1000)
    s.assign("g", a, Q, 1000)
    s.leave("g", a)
    assert sorted(s.assign("g", b, Q, 1000).granted) == Q


def test_retention_takeover_and_the_old_owner_learns_it():
    s, clock = make()
    a = s.join("g", ["T"], 1000)
    ra = s.assign("g", a, Q[:1], 1000)
    epoch = ra.owned[Q[0]]
    b = s.join("g", ["T"], 1000)
    clock.t += 0.9
    assert s.assign("g", b, Q[:1], 1000).granted == []  # within a's retention
    clock.t += 0.2
    rb = s.assign("g", b, Q[:1], 1000)  # a silent for 1.1 s > 1 s
    assert rb.granted == Q[:1] and rb.owned[Q[0]] != epoch
    assert s.takeovers == 1
    assert not s.holds("g", a, Q[0], epoch)
    assert s.holds("g", b, Q[0], rb.owned[Q[0]])
    ra = s.assign("g", a, Q[:1], 1000)
    assert ra.lost == Q[:1] and ra.owned == {} and ra.granted == []


def test_heartbeats_keep_queues():
    s, clock = make()
    a = s.join("g", ["T"], 1000)
    ra = s.assign("g", a, Q[:1], 1000)
    b = s.join("g", ["T"], 1000)
    for _ in range(5):
        clock.t += 0.6
        s.heartbeat("g", a)
        assert s.assign("g", b, Q[:1], 1000).granted == []
    assert s.holds("g", a, Q[0], ra.owned[Q[0]])


def test_groups_are_independent():
    s, _ = make()
    a = s.join("g1", ["T"], 1000)
    b = s.join("g2", ["T"], 1000)
    assert sorted(s.assign("g1", a, Q, 1000).owned) == Q
    assert sorted(s.assign("g2", b, Q, 1000).owned) == Q
    assert owners_are_exclusive(s, "g1") and owners_are_exclusive(s, "g2")
