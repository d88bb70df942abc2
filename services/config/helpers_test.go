package config

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/gateway/errmap"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	"github.com/clawmesh/clawmesh/services/config/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// env is one config service on a fresh database and NATS server.
type env struct {
	t       testing.TB
	srv     *Server
	opts    Options
	natsURL string
	rpc     configv1.ConfigServiceClient
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newEnv starts a Server on a new database, with its NATS connection and
// a gRPC client on a Unix socket; log may be nil.
func newEnv(t testing.TB, log *zap.Logger) *env {
	t.Helper()
	return newEnvOn(t, migratedDB(t), log)
}

// migratedDB is a new database of the test's own with the config
// schema's migrations applied: a copy of one migrated once a process
// (testenv.PostgresPrepared), where each test applied all of them anew.
func migratedDB(t testing.TB) string {
	t.Helper()
	return testenv.PostgresPrepared(t, "config", func(ctx context.Context, url string) error {
		db, err := pg.Open(ctx, url, "config", migrations.FS, zap.NewNop())
		if err != nil {
			return err
		}
		db.Close()
		return nil
	})
}

// newEnvOn is newEnv on the database at dbURL.
func newEnvOn(t testing.TB, dbURL string, log *zap.Logger) *env {
	t.Helper()
	ctx := ctxFor(t)
	if log == nil {
		log = zap.NewNop()
	}
	db, err := pg.Open(ctx, dbURL, "config", migrations.FS, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	natsURL := testenv.NATS(t)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e := &env{t: t, natsURL: natsURL, opts: Options{DB: db, NATS: nc, DataDir: t.TempDir(), Log: log}}
	e.srv, err = New(ctx, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "config.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(grpcserver.MaxMessageBytes), grpc.MaxSendMsgSize(grpcserver.MaxMessageBytes))
	configv1.RegisterConfigServiceServer(gs, e.srv)
	go gs.Serve(lis) //nolint:errcheck // ends at Stop
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcserver.MaxMessageBytes), grpc.MaxCallSendMsgSize(grpcserver.MaxMessageBytes)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	e.rpc = configv1.NewConfigServiceClient(cc)
	return e
}

// nats opens another connection to the test's NATS server.
func (e *env) nats() *nats.Conn {
	nc, err := nats.Connect(e.natsURL)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

var operator = &commonv1.Principal{PrincipalId: OperatorPrincipal, Operator: true, PeerUid: 1000, PeerPid: 42}

func userPrincipal(name string, uid int32) *commonv1.Principal {
	return &commonv1.Principal{PrincipalId: "user:" + name, User: name, PeerUid: uid, PeerPid: 43}
}

type kv struct {
	prop  string
	value any
}

func entries(t testing.TB, sets ...kv) []*configv1.Entry {
	t.Helper()
	out := make([]*configv1.Entry, len(sets))
	for i, s := range sets {
		v, err := structpb.NewValue(s.value)
		if err != nil {
			t.Fatalf("value %v: %v", s.value, err)
		}
		out[i] = &configv1.Entry{Prop: s.prop, Value: v}
	}
	return out
}

// setMany calls SetMany over gRPC.
func (e *env) setMany(pr *commonv1.Principal, sets ...kv) (*configv1.SetManyResponse, error) {
	return e.rpc.SetMany(ctxFor(e.t), &configv1.SetManyRequest{Principal: pr, Sets: entries(e.t, sets...)})
}

// mustSet commits sets as the operator.
func (e *env) mustSet(sets ...kv) int64 {
	e.t.Helper()
	resp, err := e.setMany(operator, sets...)
	if err != nil {
		e.t.Fatalf("set-many %v: %v", sets, err)
	}
	return resp.GetRevision()
}

// get reads a prop as the operator, as plain Go values.
func (e *env) get(prop string) (any, error) {
	resp, err := e.rpc.Get(ctxFor(e.t), &configv1.GetRequest{Principal: operator, Prop: prop})
	if err != nil {
		return nil, err
	}
	return resp.GetValue().AsInterface(), nil
}

// storedRevisions counts the committed revisions in the database.
func (e *env) storedRevisions() (n int64, newest int64) {
	e.t.Helper()
	err := e.opts.DB.QueryRow(ctxFor(e.t), "SELECT count(*), coalesce(max(revision), 0) FROM revisions").Scan(&n, &newest)
	if err != nil {
		e.t.Fatal(err)
	}
	return n, newest
}

// refusal reads the code, reason and index of a refused call.
func refusal(t testing.TB, err error) (st *status.Status, reason string, index int) {
	t.Helper()
	if err == nil {
		t.Fatal("call succeeded, want a refusal")
	}
	st, _ = status.FromError(err)
	reason, index = rpcerr.Details(st)
	return st, reason, index
}

// wire is what the gateway would send the client for err.
func wire(err error) errmap.WireError { return errmap.ToWire("config", err) }
