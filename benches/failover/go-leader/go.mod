module leader-gate.dev/go-leader

go 1.22
