module github.com/consistd/consistd/hack/stock-clients/go

go 1.25.0

require (
	github.com/consistd/consistd/client-sdk/go v0.0.0
	google.golang.org/grpc v1.83.2
)

require (
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// The generated code in client-sdk/go/gen, from this checkout.
replace github.com/consistd/consistd/client-sdk/go => ../../../client-sdk/go
