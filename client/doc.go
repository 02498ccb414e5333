// Package client is an [http.RoundTripper] for services that call LLM APIs
// through ssegate. Give it to an SDK's HTTP client and every request gets
// an Idempotency-Key, retries before the answer starts, and a streamed
// answer cut mid-way resumes by itself from its Last-Event-ID: the SDK's
// stream iterator sees one stream, with no gap and no duplicate.
//
// With openai-go:
//
//	c := openai.NewClient(
//		option.WithBaseURL("http://ssegate:8080/v1/"),
//		option.WithHTTPClient(&http.Client{Transport: &client.Transport{}}),
//		option.WithMaxRetries(0), // or pin a key: the Transport retries
//	)
//	ctx = client.WithIdempotencyKey(ctx, "order-42-summary")
//	stream := c.Chat.Completions.NewStreaming(ctx, params)
//	for stream.Next() {
//		fmt.Print(stream.Current().Choices[0].Delta.Content)
//	}
//	err := stream.Err() // errors.Is(err, client.ErrStreamGone), errors.As(err, &aborted)
//
// With anthropic-sdk-go:
//
//	c := anthropic.NewClient(
//		option.WithBaseURL("http://ssegate:8080/"),
//		option.WithHTTPClient(&http.Client{Transport: &client.Transport{}}),
//	)
//	ctx = client.WithIdempotencyKey(ctx, "ticket-7-reply") // the SDK's retries join
//	stream := c.Messages.NewStreaming(ctx, params)
//	for stream.Next() {
//		fmt.Println(stream.Current().Type)
//	}
//	err := stream.Err()
//
// The examples show both whole.
//
// An SDK's own retry is a new request: without a pinned key each attempt
// would get a fresh key, and a generation of its own. Either turn the
// SDK's retries off (option.WithMaxRetries(0)) and let the Transport retry,
// or pin one key per intent with [WithIdempotencyKey], so that a retry
// joins or replays the first generation.
package client
