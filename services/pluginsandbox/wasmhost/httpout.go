package wasmhost

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

var httpMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true}

// maxResponseHeaderBytes bounds a response's header section. MaxResponseBytes
// bounded the body only, and the transport's default took 10 MB of
// headers, which the JSON given to the guest carried six bytes to one for
// every <, > or &: a 9 MiB header became 54 MiB of the host's heap, at
// every call, 64 calls at a time.
const maxResponseHeaderBytes = 64 << 10

// maxRedirects is how many redirects a request follows.
const maxRedirects = 5

// errTooManyRedirects stops a request past maxRedirects.
var errTooManyRedirects = errors.New("too many redirects")

// newHTTPClient returns the client behind the http_request import: no proxy
// from the environment, no cookie jar, at most 5 redirects, at most
// maxResponseHeaderBytes of headers, and only public addresses or those in
// allowed.
func newHTTPClient(allowed []netip.Prefix) *http.Client {
	tr := &http.Transport{
		Proxy:       nil,
		DialContext: guardedDialer(allowed).DialContext,
		// A transport with its own dialer speaks HTTP/2 only when asked:
		// without this the address check took it from plugins.
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           64,
		IdleConnTimeout:        30 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  0, // the request context bounds it
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(_ *http.Request, via []*http.Request) error {
		if len(via) > maxRedirects {
			return errTooManyRedirects
		}
		return nil
	}}
}

// doHTTP performs one outbound request for a guest. The context carries the
// call deadline, so a slow server is cut when the call's time is up; a
// guest's timeout_ms may shorten but never extend it. It returns the JSON
// response or a negative result code.
func (h *Host) doHTTP(ctx context.Context, raw []byte) ([]byte, int64) {
	var req abi.HTTPRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, codeInvalidArgument
	}
	req.Method = strings.ToUpper(req.Method)
	if req.Method == "" {
		req.Method = "GET"
	}
	u, err := url.Parse(req.URL)
	if err != nil || !httpMethods[req.Method] || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, codeInvalidArgument
	}
	if int64(len(req.Body)) > h.cfg.HTTP.MaxRequestBytes {
		return nil, codeTooLarge
	}
	timeout := h.cfg.HTTP.Timeout
	if req.TimeoutMS > 0 && time.Duration(req.TimeoutMS)*time.Millisecond < timeout {
		timeout = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body io.Reader
	if len(req.Body) > 0 {
		body = strings.NewReader(string(req.Body))
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, u.String(), body)
	if err != nil {
		return nil, codeInvalidArgument
	}
	for k, v := range req.Headers {
		hr.Header.Set(k, v)
	}
	resp, err := h.http.Do(hr)
	if errors.Is(err, errDestinationRefused) {
		h.logger.Warn("plugin http request refused", zap.String("url", u.Redacted()), zap.Error(err))
		return nil, codeAccessDenied
	}
	if err != nil {
		// The transport says so in words only.
		if strings.Contains(err.Error(), "server response headers exceeded") {
			return nil, codeTooLarge
		}
		return nil, codeUnavailable
	}
	defer resp.Body.Close()
	limit := h.cfg.HTTP.MaxResponseBytes
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, codeUnavailable
	}
	if int64(len(data)) > limit {
		return nil, codeTooLarge
	}
	out := abi.HTTPResponse{Status: resp.StatusCode, Body: data, Headers: map[string]string{}}
	for k, v := range resp.Header {
		out.Headers[k] = strings.Join(v, ", ")
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, codeUnavailable
	}
	return b, 0
}
